"""SGLang's launch flags, defaults and validation (sglang-contract.md §1.1-1.2), plus the sim's own --sim-* flags."""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

PROG = "rig.sim"
MODELLED_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN"}  # chain drafts from an MTP head / EAGLE draft
KNOWN_ALGORITHMS = MODELLED_ALGORITHMS | {"STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"}
MAX_RUNNING_WARNING = (
    "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting "
    "--max-running-requests."
)
DRAFT_TOKENS_WARNING = (
    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2), as a user-facing CLI should."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class ArgsError(ValueError):
    """A flag the simulator would refuse (raised instead of exiting, for check_argv)."""


class _CheckingParser(_Parser):
    def error(self, message: str) -> NoReturn:
        raise ArgsError(message)


def human_readable_int(value: str) -> int:
    """'32k' -> 32000, '128Ki' -> 131072, '4096' -> 4096 (SGLang 0.5.23 accepts these for --context-length)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?)?\s*", value)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}")
    num, suffix = float(m.group(1)), (m.group(2) or "")
    base = 1024 if suffix.endswith("i") else 1000
    power = {"": 0, "k": 1, "m": 2, "g": 3}[suffix[:1].lower()]
    return int(num * base**power)


def build_parser(cls: type[argparse.ArgumentParser] = _Parser) -> argparse.ArgumentParser:
    p = cls(prog=PROG, usage=f"python -m {PROG} --model-path PATH [options]",
                description="Simulated SGLang server (speaks sglang.launch_server's flags and HTTP contract).")
    a = p.add_argument
    # model and serving
    a("--model-path", "--model", dest="model_path", required=True)
    a("--tokenizer-path", default=None)
    a("--served-model-name", default=None)
    a("--trust-remote-code", action="store_true")
    a("--dtype", default="auto")
    a("--quantization", default=None)
    a("--kv-cache-dtype", default="auto")
    a("--context-length", type=human_readable_int, default=None)
    a("--device", default="cuda")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--api-key", default=None)
    a("--admin-api-key", default=None)
    a("--log-level", default="info")
    a("--log-level-http", default=None)
    a("--random-seed", type=int, default=None)
    a("--skip-server-warmup", action="store_true")
    a("--stream-interval", type=int, default=1)
    a("--stream-response-default-include-usage", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--watchdog-timeout", type=float, default=300)
    # parallelism, memory, scheduling
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", default="fcfs", choices=["lpm", "random", "fcfs", "dfs-weight", "lof", "priority"])
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=1)
    a("--disable-radix-cache", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--attention-backend", default=None)
    a("--cuda-graph-max-bs-decode", type=int, default=None)
    a("--cuda-graph-max-bs-prefill", type=int, default=None)
    a("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    a("--disable-cuda-graph", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--bucket-time-to-first-token", type=float, nargs="+", default=None)
    a("--bucket-inter-token-latency", type=float, nargs="+", default=None)
    a("--bucket-e2e-request-latency", type=float, nargs="+", default=None)
    # speculative decoding
    a("--speculative-algorithm", type=str, default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None)
    a("--speculative-draft-model-revision", default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-accept-threshold-single", type=float, default=1.0)
    a("--speculative-accept-threshold-acc", type=float, default=1.0)
    a("--speculative-attention-mode", default="prefill", choices=["prefill", "decode"])
    # the simulator's own
    a("--sim-profile", default=None, help="performance profile YAML (default: the shipped reference profile)")
    a("--sim-spin-ms", type=float, default=1.5,
      help="wake this early before an iteration's deadline and yield-spin to it (sub-millisecond timing)")
    a("--sim-no-access-log", action="store_true", help="do not log one line per HTTP request")
    a("--sim-fault", action="append", default=[], type=_fault, metavar="SPEC",
      help="TEST ONLY: misbehave on purpose (crash, hang, slow, HTTP errors, broken streams); see rig/sim/faults.py")
    return p


def _fault(spec: str):
    from rig.sim.faults import argparse_type

    return argparse_type(spec)


@dataclass
class ServerArgs:
    """The resolved arguments, plus the warnings SGLang would log while resolving them."""

    ns: argparse.Namespace
    warnings: list[str] = field(default_factory=list)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.__dict__["ns"], item)

    @property
    def speculative(self) -> bool:
        return self.ns.speculative_algorithm is not None

    @property
    def steps(self) -> int:
        return int(self.ns.speculative_num_steps) if self.speculative else 0

    def as_dict(self) -> dict[str, Any]:
        """Every resolved field, as /server_info lists them (sim-only flags excluded)."""
        return {k: v for k, v in vars(self.ns).items() if not k.startswith("sim_")}


def check_argv(argv: list[str]) -> str | None:
    """Why the simulator would refuse these flags (one line), or None: lets the rig refuse them before it starts."""
    try:
        resolve(argv, parser=build_parser(_CheckingParser))
    except ArgsError as e:
        return str(e)
    return None


def resolve(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> ServerArgs:
    """Parse and resolve like SGLang; a bad value ends the process with a one-line error (exit 2)."""
    parser = parser or build_parser()
    ns = parser.parse_args(argv)
    args = ServerArgs(ns)

    def fail(msg: str) -> NoReturn:
        parser.error(msg)

    if ns.served_model_name is None:
        ns.served_model_name = ns.model_path
    if ":" in ns.served_model_name:
        fail("--served-model-name must not contain ':' (that is LoRA base:adapter syntax)")
    if ns.tokenizer_path is None:
        ns.tokenizer_path = ns.model_path
    if ns.log_level_http is None:
        ns.log_level_http = ns.log_level
    if ns.random_seed is None:
        ns.random_seed = random.randint(0, 2**30)
    for name in ("tp_size", "dp_size", "pp_size", "stream_interval", "decode_log_interval", "page_size"):
        if getattr(ns, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if ns.mem_fraction_static is not None and not 0.0 < ns.mem_fraction_static < 1.0:
        fail("--mem-fraction-static must be between 0 and 1")
    if ns.max_running_requests is not None and ns.max_running_requests < 1:
        fail("--max-running-requests must be >= 1")
    if ns.api_key is not None and ns.admin_api_key is None:
        pass  # admin endpoints accept the api key
    _resolve_speculative(ns, args.warnings, fail)
    return args


def _resolve_speculative(ns: argparse.Namespace, warnings: list[str], fail: Any) -> None:
    algo = ns.speculative_algorithm
    if algo is None:
        for flag in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            if getattr(ns, flag) is not None:
                fail(f"--{flag.replace('_', '-')} needs --speculative-algorithm")
        return
    algo = algo.upper()
    if algo not in KNOWN_ALGORITHMS:
        fail(f"Unknown speculative algorithm name: {ns.speculative_algorithm}")
    if algo not in MODELLED_ALGORITHMS:
        fail(f"speculative algorithm {algo} is not modelled by the simulator (it models EAGLE/EAGLE3/NEXTN chains)")
    ns.speculative_algorithm = "EAGLE" if algo == "NEXTN" else algo  # NEXTN is an alias of EAGLE
    if ns.max_running_requests is None:
        ns.max_running_requests = 48
        warnings.append(MAX_RUNNING_WARNING)
    if ns.speculative_num_steps is None:
        if ns.speculative_eagle_topk is not None or ns.speculative_num_draft_tokens is not None:
            fail("--speculative-eagle-topk and --speculative-num-draft-tokens need --speculative-num-steps "
                 "(leave all three unset for the automatic choice)")
        ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens = 3, 1, 4
    elif ns.speculative_eagle_topk is None:
        fail("--speculative-num-steps needs --speculative-eagle-topk (SGLang fails later on topk None)")
    if ns.speculative_num_steps < 1:
        fail("--speculative-num-steps must be >= 1")
    if ns.speculative_eagle_topk < 1:
        fail("--speculative-eagle-topk must be >= 1")
    if ns.speculative_eagle_topk > 1:
        fail("--speculative-eagle-topk > 1 (draft trees) is not modelled by the simulator; use 1")
    if ns.speculative_num_draft_tokens != ns.speculative_num_steps + 1:
        ns.speculative_num_draft_tokens = ns.speculative_num_steps + 1
        warnings.append(DRAFT_TOKENS_WARNING)
    if ns.speculative_draft_model_path is not None and ns.speculative_draft_model_revision is None:
        ns.speculative_draft_model_revision = "main"


def context_length_allowed(requested: int, model_max: int) -> bool:
    """Above the model's maximum only with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, like SGLang."""
    return requested <= model_max or os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") == "1"


def main_error(msg: str, code: int = 1) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    raise SystemExit(code)
