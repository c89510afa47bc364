"""``conveyor simulate``: a discrete-event simulator around Conveyor's real decision classes.

``clock`` (the virtual clock), ``scenario`` (the YAML), ``timemodel`` (step and batch times
from a GPU preset or a calibration), ``fleet`` (workers, gateways, heartbeats), ``gateway``,
``llm_worker`` and ``oneshot_worker`` (the real router, scheduler and batching objects),
``counted_worker`` (a generative worker's scheduling rules over token counts, for large
fleets: ``counted_engine``, ``counted_pool``, ``counted_cache``),
``traffic`` (sources), ``jobs`` (batch jobs by shard lease), ``faults``, ``metrics``,
``run`` (one run and its totals), ``output`` (JSON, PNG, summary) and ``distribution`` (a
model pulled through the real fetch planner).
"""
