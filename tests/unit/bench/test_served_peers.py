"""How the served benchmark starts llama.cpp's servers, what it asks of them, and which
contenders it skips (and why) where they cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.generate_served import parse_args
from bench.served_peers import (
    MAX_MODEL_LEN,
    llama_server_argv,
    llamacpp_argv,
    llamacpp_body,
    llamacpp_env,
    missing_peers,
    peer_notes,
    request_headers,
    served_gguf,
    workload_skips,
)
from bench.served_settings import CONVEYOR, HF_STATIC, LLAMA_SERVER, LLAMACPP, MODEL_NAME, VLLM

from conveyor.cli.omp_wait import SPIN_COUNT


def test_llamacpp_serves_the_gguf_under_the_bench_name_with_its_threads(tmp_path: Path) -> None:
    settings, _ = parse_args(["--contenders", LLAMACPP, "--threads", "3"])
    argv = llamacpp_argv(settings, tmp_path / "m.gguf", 8124)
    assert argv[1:3] == ["-m", "bench.llamacpp_server"]  # llama_cpp.server, any request id
    assert argv[0].endswith(".venv-llamacpp/bin/python")
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs["--model"] == str(tmp_path / "m.gguf")
    assert pairs["--model_alias"] == MODEL_NAME
    assert pairs["--n_threads"] == pairs["--n_threads_batch"] == "3"
    assert pairs["--n_ctx"] == str(MAX_MODEL_LEN)
    assert pairs["--interrupt_requests"] == "False"  # a waiting request must not cut one off
    assert pairs["--disable_ping_events"] == "True"  # vllm bench serve's client chokes on them
    assert (pairs["--host"], pairs["--port"]) == ("127.0.0.1", "8124")


def test_llama_server_gives_every_client_a_slot_of_its_own(tmp_path: Path) -> None:
    settings, _ = parse_args(["--contenders", LLAMA_SERVER, "--threads", "3",
                              "--max-num-seqs", "48", "--llama-server-dir", "/opt/ls"])  # fmt: skip
    argv = llama_server_argv(settings, tmp_path / "m.gguf", 8124)
    assert argv[0] == "/opt/ls/bin/llama-server"
    flags = [arg for arg in argv[1:] if arg in ("--cont-batching", "--no-webui")]
    assert flags == ["--cont-batching", "--no-webui"]
    assert "--kv-unified" not in argv  # a shared cache attends every slot's cells
    valued = [arg for arg in argv[1:] if arg not in flags]
    pairs = dict(zip(valued[::2], valued[1::2], strict=True))
    assert pairs["--model"] == str(tmp_path / "m.gguf")
    assert pairs["--alias"] == MODEL_NAME
    assert pairs["--threads"] == pairs["--threads-batch"] == "3"
    assert pairs["--parallel"] == "48"  # a slot for every request the others run at once
    assert pairs["--ctx-size"] == str(48 * MAX_MODEL_LEN)  # split evenly: 2048 a slot
    assert (pairs["--host"], pairs["--port"]) == ("127.0.0.1", "8124")


def test_only_llama_servers_requests_each_open_their_own_connection() -> None:
    # it closes a connection after a stream; a request written to it meanwhile was lost
    assert request_headers(LLAMA_SERVER) == {"Connection": "close"}
    assert all(request_headers(name) == {} for name in (CONVEYOR, VLLM, LLAMACPP, HF_STATIC))


def test_llama_server_is_skipped_with_how_to_build_it_and_notes_its_slots(tmp_path: Path) -> None:
    absent, _ = parse_args(["--contenders", LLAMA_SERVER, "--llama-server-dir", str(tmp_path)])
    assert "make llama-server" in missing_peers(absent)[LLAMA_SERVER]
    built = tmp_path / "bin" / "llama-server"
    built.parent.mkdir()
    built.touch()
    settings, _ = parse_args(["--contenders", f"{LLAMA_SERVER},{LLAMACPP}",
                              "--llama-server-dir", str(tmp_path), "--gguf", "/m/x.gguf",
                              "--max-num-seqs", "32"])  # fmt: skip
    assert LLAMA_SERVER not in missing_peers(settings)
    notes = peer_notes(settings)
    assert notes[LLAMA_SERVER]["parallelism"].startswith(f"32 slots of {MAX_MODEL_LEN} tokens")
    assert notes[LLAMA_SERVER]["gguf"] == "x.gguf"
    assert "one request at a time" in notes[LLAMACPP]["parallelism"]


def test_llamacpp_threads_wait_as_conveyors_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert llamacpp_env() == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(SPIN_COUNT)}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert llamacpp_env() == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_llamacpp_is_asked_for_exactly_the_output_length() -> None:
    settings, _ = parse_args(["--output-len", "96"])
    assert llamacpp_body(settings) == {"min_tokens": 96, "max_tokens": 96}


def test_llamacpp_notes_its_gguf_and_that_it_serves_one_request_at_a_time() -> None:
    settings, _ = parse_args(["--contenders", LLAMACPP, "--gguf", "/models/x.F16.gguf"])
    notes = peer_notes(settings)[LLAMACPP]
    assert notes["gguf"] == "x.F16.gguf"
    assert "F16 copy" in notes["weights"]
    assert "one request at a time" in notes["parallelism"]
    assert peer_notes(parse_args([])[0]) == {}
    quantized, _ = parse_args(["--contenders", LLAMACPP, "--llamacpp-quantized"])
    assert "as it is" in peer_notes(quantized)[LLAMACPP]["weights"]


def test_llamacpp_serves_an_f16_copy_unless_told_to_serve_the_file_as_it_is(
    tmp_path: Path,
) -> None:
    settings, _ = parse_args(["--contenders", LLAMACPP, "--gguf", "/models/x.gguf"])
    assert served_gguf(settings, tmp_path) == tmp_path / "llamacpp-f16.gguf"
    quantized, _ = parse_args(["--gguf", "/models/x.gguf", "--llamacpp-quantized"])
    assert served_gguf(quantized, tmp_path) == Path("/models/x.gguf")


def test_hf_static_has_no_chat_workload() -> None:
    chat_only, _ = parse_args(["--contenders", f"{CONVEYOR},{HF_STATIC}", "--workload", "chat"])
    assert "no server" in missing_peers(chat_only)[HF_STATIC]
    both, _ = parse_args(["--contenders", HF_STATIC, "--workload", "random,chat"])
    skipped = missing_peers(both)
    assert HF_STATIC not in skipped
    assert set(workload_skips(both, skipped)) == {f"{HF_STATIC}/chat"}
    assert workload_skips(parse_args(["--contenders", HF_STATIC])[0], {}) == {}


def test_the_smoke_run_skips_installed_peers_it_cannot_serve_its_tiny_model_with(
    tmp_path: Path,
) -> None:
    vllm = tmp_path / "venv" / "bin" / "vllm"
    vllm.parent.mkdir(parents=True)
    vllm.touch()
    settings, _ = parse_args(["--smoke", "--contenders", f"{CONVEYOR},{VLLM},{HF_STATIC}",
                              "--vllm-venv", str(tmp_path / "venv")])  # fmt: skip
    assert set(missing_peers(settings)) == {VLLM}
    assert "--smoke" in missing_peers(settings)[VLLM]
