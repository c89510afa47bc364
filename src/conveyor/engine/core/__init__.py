"""The engine's plain logic, free of torch: sequences, the KV block manager, the scheduler.

``sequence`` (one request's tokens and state), ``block_manager`` (the paged KV cache's
blocks, prefix sharing), ``scheduler`` with ``step_plan`` (what runs each step), ``step``
(the contract with the model runner), ``job_share`` (batch jobs' share of a step while
online traffic is present), ``siblings`` (requests sharing a prompt), ``prefix_digest`` (the
cached prefixes a worker reports), ``prefill_time`` and ``seat_turnover`` (deadline
estimates), ``limits`` (what a model must meet to start) and ``engine_config`` (the engine's
limits and counters).
"""
