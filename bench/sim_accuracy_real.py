"""The real runs ``bench.sim_accuracy`` holds the simulator against, on this machine.

- One-shot cases: one gateway and three workers as ``bench.fleet`` starts them (the
  synthetic model, batches of at most 4 taking 40 ms: 300 inputs/s in all), each
  worker's queue capped at ``ONE_SHOT_MAX_QUEUE`` inputs so overload is refused with 429.
  First the fleet's capacity as it is on this machine now (closed loop, 64 clients: 300
  inputs/s on an idle machine, less when other processes take CPU); then open-loop load
  on the load generator's fixed schedule at 50% and 90% of it and at twice it, one after
  another on the same fleet, and the capacity again after them (how far it drifted).
- Chat case: ``bench.prefix_routing``'s fleet (three workers serving a small random
  Llama, a gateway routing by prefix) and its scripted sessions, each turn re-sending the
  whole conversation: the prefix-cache hit ratio from the workers' counters, and the
  prompt's token counts through the gateway's tokenizer, which the simulated sessions use.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.fleet import SLOW_MODEL, Fleet, fresh_database, wait_routable, write_bodies
from bench.loadgen import LoadMode, LoadSpec, run_load_process

SATURATION_CLIENTS = 64
ONE_SHOT_MAX_QUEUE = 64
LOADS = {"steady_50": 0.5, "steady_90": 0.9, "overload_2x": 2.0}
CHAT = {"sessions": 12, "turns": 4, "max_tokens": 16, "load_bound": 4, "seed": 0}


def measure_one_shot(work_dir: Path, seconds: float) -> dict[str, Any]:
    """Each load of ``LOADS`` for ``seconds`` on one fleet: the load generator's result."""
    model = {**SLOW_MODEL, "max_queue": ONE_SHOT_MAX_QUEUE}
    bodies = write_bodies(work_dir / "bodies.json")
    runs: dict[str, Any] = {}
    with fresh_database() as store_url, ExitStack() as stack:
        fleet = Fleet(store_url, work_dir, stack)
        gateway = fleet.add_gateway()
        for name in ("w0", "w1", "w2"):
            fleet.add_worker(name, model)
        wait_routable(gateway, {"w0", "w1", "w2"})
        saturation = LoadSpec(mode=LoadMode.CLOSED, seconds=seconds, num_clients=SATURATION_CLIENTS,
                              ramp_s=1.0, drain_s=2.0)  # fmt: skip
        runs["capacity"] = run_load_process(saturation, gateway.port, bodies).to_dict()
        capacity = float(runs["capacity"]["throughput_per_s"])
        for case, share in LOADS.items():
            time.sleep(1.0)  # queues empty before the next load
            spec = LoadSpec(mode=LoadMode.OPEN, seconds=seconds, rate_per_s=share * capacity,
                            expected_latency_ms=60, drain_s=3.0)  # fmt: skip
            runs[case] = run_load_process(spec, gateway.port, bodies).to_dict()
        time.sleep(1.0)
        # Again at the end: how far the machine's capacity drifted while the loads ran.
        runs["capacity_after"] = run_load_process(saturation, gateway.port, bodies).to_dict()
    return runs


def _prompt_shape(checkpoint: Path, system: str, messages: list[str]) -> dict[str, float]:
    """Tokens of the shared system part and of a user turn, through the chat template."""
    from conveyor.fleet.prompt_tokens import GatewayTokenizer

    tokenizer = GatewayTokenizer(checkpoint)
    head = {"role": "system", "content": system}
    firsts = [tokenizer.encode_chat([head, {"role": "user", "content": m}]) for m in messages]
    shared = min(len(f) for f in firsts)
    while any(f[:shared] != firsts[0][:shared] for f in firsts):
        shared -= 1
    return {"system_tokens": shared,
            "user_tokens": sum(len(f) for f in firsts) / len(firsts) - shared}  # fmt: skip


def measure_chat(work_dir: Path) -> dict[str, Any]:
    """``CHAT``'s sessions through a prefix-routing gateway on three Llama workers."""
    from bench.prefix_routing import MODEL_SHAPE, Options, run_mode
    from bench.prefix_traffic import SYSTEM_PROMPT, session_scripts
    from conveyor.fakes.checkpoints import build_tiny_llama

    checkpoint = build_tiny_llama(work_dir / "llama", **MODEL_SHAPE)
    scripts = session_scripts(CHAT["sessions"], CHAT["turns"], random.Random(CHAT["seed"]))
    opts = Options(work_dir, False, CHAT["sessions"], CHAT["turns"], 3, CHAT["max_tokens"],
                   CHAT["load_bound"], 1, CHAT["seed"])  # fmt: skip
    with fresh_database() as store_url:
        run = run_mode(opts, "prefix", store_url, work_dir, checkpoint, scripts)
    messages = [m for s in scripts for m in s.user_messages]
    return {**run, **_prompt_shape(checkpoint, SYSTEM_PROMPT, messages), **CHAT}
