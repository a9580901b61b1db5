"""SGLang's launch flags, defaults and validation (SGLang's server_args.py), plus the sim's own --sim-* flags."""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rig.sim.resolution import refusal, resolve_backends

if TYPE_CHECKING:
    from rig.sim.faults import Fault

PROG = "rig.sim"
SGLANG_VERSION = "0.5.23"  # the release whose parser the flag table was generated from
# Releases whose behaviour differs where the simulator models it (--sim-sglang-version; the flag table stays 0.5.23's):
# 0.5.17's adaptive default table and its startup crash (rig/sim/adaptive.py, rig/sim/launch.py).
SGLANG_VERSIONS = ("0.5.17", "0.5.23")
ARGS_TABLE = Path(__file__).parent / "data" / f"sglang_args_{SGLANG_VERSION.replace('.', '_')}.json"
# Options whose value changes what the simulator does; every other SGLang option is accepted and ignored.
MODELLED = frozenset(
    {
        "model_path",
        "tokenizer_path",
        "served_model_name",
        "context_length",
        "host",
        "port",
        "api_key",
        "admin_api_key",
        "log_level",
        "log_level_http",
        "random_seed",
        "skip_server_warmup",
        "stream_interval",
        "stream_response_default_include_usage",
        "enable_cache_report",
        "decode_log_interval",
        "tp_size",
        "mem_fraction_static",
        "max_running_requests",
        "max_total_tokens",
        "chunked_prefill_size",
        "max_prefill_tokens",
        "disable_radix_cache",
        "enable_metrics",
        "bucket_time_to_first_token",
        "bucket_inter_token_latency",
        "bucket_e2e_request_latency",
        "speculative_algorithm",
        "speculative_draft_model_path",
        "speculative_draft_model_revision",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "enable_deterministic_inference",
        "sampling_defaults",
        "speculative_adaptive",
        "speculative_adaptive_config",
        "disable_overlap_schedule",
        "mamba_radix_cache_strategy",
        "max_mamba_cache_size",
        "mamba_full_memory_ratio",
        "cuda_graph_max_bs_decode",
    }
)
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
    """SGLang's parser type for token counts (utils/common.py::human_readable_int): '32k' -> 32000,
    '128Ki' -> 131072; suffixes are case-sensitive, decimals only with SI suffixes."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. Use an integer IEC value such as "
                    f"'{int(Decimal(number))}{suffix}', or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * 2 ** (10 * "KMGT".index(suffix[0]) + 10)
        return int(Decimal(number) * 10 ** (3 * "kMGT".index(suffix) + 3))
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, "
            "1Mi). Suffixes are case-sensitive."
        ) from None


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON: {e}") from None


def _nullable_str(value: str) -> str | None:
    return None if not value or value == "None" else value


def _cuda_graph_backend(value: str) -> str:
    if value == "tc_piecewise":  # model_executor/cuda_graph_config.py::parse_cuda_graph_backend_arg
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return value


def _json_object(value: str) -> dict:
    parsed = _json_value(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(parsed).__name__}")
    return parsed


# The argparse `type` of each table row, by the name SGLang's parser used (the table records names, not code).
_TYPES: dict[str | None, Any] = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "human_readable_int": human_readable_int,
    "loads": _json_value,
    "json_list_type": _json_value,
    "nullable_str": _nullable_str,
    "parse_cuda_graph_backend_arg": _cuda_graph_backend,
    "parse_cuda_graph_config_arg": _json_object,
}


def load_table(path: Path = ARGS_TABLE) -> dict[str, Any]:
    """The checked-in table of SGLang's server arguments (scripts/sglang_args.py regenerates it)."""
    return json.loads(path.read_text())


def _add_sglang_arguments(p: argparse.ArgumentParser, rows: list[dict[str, Any]]) -> None:
    """Every option SGLang's own parser has, with its names, dest, type, default, choices and nargs."""
    for row in rows:
        action, flags = row["action"], row["flags"]
        kw: dict[str, Any] = {"dest": row["dest"], "default": row["default"]}
        if row["type"] not in _TYPES:
            raise RuntimeError(f"{ARGS_TABLE.name}: no converter for argparse type {row['type']!r}")
        if action in ("store_true", "store_false", "custom:DeprecatedStoreTrueAction"):
            kw["action"] = "store_false" if action == "store_false" else "store_true"
        elif action == "boolean_optional":
            kw["action"] = argparse.BooleanOptionalAction
            flags = [f for f in flags if not f.startswith("--no-")]  # the action adds the --no- form itself
        elif action == "store_const":
            kw.update(action="store_const", const=row["const"])
        elif action == "append":
            kw.update(action="append", type=_TYPES[row["type"]], choices=row["choices"])
        elif action == "count":
            kw["action"] = "count"
        else:  # store, and SGLang's custom actions that take values (LoRA paths, deprecated store-const)
            kw.update(type=_TYPES[row["type"]], choices=row["choices"])
            if row["nargs"] is not None:
                kw["nargs"] = row["nargs"]
        if row["required"]:
            kw["required"] = True
        p.add_argument(*flags, **kw)


def build_parser(cls: type[argparse.ArgumentParser] = _Parser) -> argparse.ArgumentParser:
    """SGLang's parser, rebuilt from the table, plus the simulator's own --sim-* flags."""
    p = cls(
        prog=PROG,
        usage=f"python -m {PROG} --model-path PATH [options]",
        description="Simulated SGLang server (speaks sglang.launch_server's flags and HTTP contract).",
    )
    _add_sglang_arguments(p, load_table()["arguments"])
    a = p.add_argument
    # the simulator's own (no SGLang option starts with --sim, so SGLang's prefix matches are unchanged)
    a("--sim-profile", default=None, help="performance profile YAML (default: the shipped reference profile)")
    a(
        "--sim-spin-ms",
        type=float,
        default=1.5,
        help="wake this early before an iteration's deadline and reach it in sub-millisecond naps between yields",
    )
    a("--sim-no-access-log", action="store_true", help="do not log one line per HTTP request")
    a(
        "--sim-sglang-version",
        choices=SGLANG_VERSIONS,
        default=SGLANG_VERSIONS[-1],
        help="the SGLang release to emulate where releases differ (adaptive speculation's defaults and failures)",
    )
    a(
        "--sim-fault",
        action="append",
        default=[],
        type=_fault,
        metavar="SPEC",
        help="TEST ONLY: misbehave on purpose (crash, hang, slow, stall, HTTP errors, broken streams); "
        "see rig/sim/faults.py",
    )
    return p


def _fault(spec: str) -> Fault:
    from rig.sim.faults import argparse_type

    return argparse_type(spec)


@dataclass
class ServerArgs:
    """The resolved arguments, plus the warnings SGLang would log while resolving them."""

    ns: argparse.Namespace
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # SGLang options given that the simulator does not model
    launch_command: str = ""  # the command line as given, for /server_info (secrets left in, as SGLang leaves them)

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


def ignored_options(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> list[str]:
    """The SGLang options set away from their default that change nothing in the simulator (logged once each)."""
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest in MODELLED or action.dest.startswith("sim_"):
            continue
        if action.dest != "help" and getattr(ns, action.dest, None) != action.default:
            out.append(action.option_strings[0])
    return out


@functools.cache
def _checking_parser() -> argparse.ArgumentParser:
    """One parser for every check (building it from the table is ~20x the cost of a parse; parse_args keeps no
    state between calls)."""
    return build_parser(_CheckingParser)


def check_argv(argv: list[str]) -> str | None:
    """Why the simulator would refuse these flags (one line), or None: lets the rig refuse them before it starts."""
    try:
        resolve(argv, parser=_checking_parser())
    except ArgsError as e:
        return str(e)
    return None


def _launch_command(argv: list[str], ns: argparse.Namespace) -> str:
    """SGLang's launch_command: the arguments joined by spaces with only the watermark configuration redacted
    (srt/server_args.py prepare_server_args, srt/sampling/watermarking/core.py redact_watermark_command_line)."""
    secret = getattr(ns, "watermark_config", None)
    out, hide = [], False
    for a in argv:
        if hide or (secret is not None and a == secret):
            out.append("<redacted>")
        elif a.startswith("--watermark-config=") or (secret is not None and "=" in a and a.split("=", 1)[1] == secret):
            out.append(a.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(a)
        hide = a == "--watermark-config"
    return " ".join(out)


def resolve(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> ServerArgs:
    """Parse and resolve like SGLang; a bad value ends the process with a one-line error (exit 2)."""
    parser = parser or build_parser()
    ns = parser.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    args = ServerArgs(ns, ignored=ignored_options(parser, ns), launch_command=_launch_command(given, ns))

    def fail(msg: str) -> NoReturn:
        parser.error(msg)

    if ns.served_model_name is None:
        ns.served_model_name = ns.model_path
    if ns.tokenizer_path is None:
        ns.tokenizer_path = ns.model_path
    if ns.log_level_http is None:
        ns.log_level_http = ns.log_level
    if ns.random_seed is None:
        ns.random_seed = random.randint(0, 2**30)
    if ns.page_size is None:
        ns.page_size = 1
    for name in ("tp_size", "dp_size", "pp_size", "stream_interval", "decode_log_interval", "page_size"):
        if getattr(ns, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if ns.mem_fraction_static is not None and not 0.0 < ns.mem_fraction_static < 1.0:
        fail("--mem-fraction-static must be between 0 and 1")
    if ns.max_running_requests is not None and ns.max_running_requests < 1:
        fail("--max-running-requests must be >= 1")
    found = refusal(ns)  # SGLang's resolution asserts and ValueErrors (rig/sim/resolution.py)
    if found:
        fail(found)
    _resolve_speculative(ns, args.warnings, fail)
    resolve_backends(ns, args.warnings)
    return args


def _no_algorithm(ns: argparse.Namespace, warnings: list[str], fail: Any) -> None:
    """Speculative flags without --speculative-algorithm: adaptive is switched off, the others refused."""
    if ns.speculative_adaptive:
        _resolve_adaptive(ns, warnings, fail)  # switches it off: no algorithm
    for flag in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
        if getattr(ns, flag) is not None:
            fail(f"--{flag.replace('_', '-')} needs --speculative-algorithm")


def _resolve_speculative(ns: argparse.Namespace, warnings: list[str], fail: Any) -> None:
    algo = ns.speculative_algorithm
    if algo is None:
        _no_algorithm(ns, warnings, fail)
        return
    algo = algo.upper()
    if algo not in KNOWN_ALGORITHMS:
        fail(f"Unknown speculative algorithm name: {ns.speculative_algorithm}")
    if algo not in MODELLED_ALGORITHMS:
        fail(f"speculative algorithm {algo} is not modelled by the simulator (it models EAGLE/EAGLE3/NEXTN chains)")
    ns.speculative_algorithm = "EAGLE" if algo == "NEXTN" else algo  # NEXTN is an alias of EAGLE
    if ns.speculative_adaptive:
        _resolve_adaptive(ns, warnings, fail)
    if ns.max_running_requests is None:
        ns.max_running_requests = 48
        warnings.append(MAX_RUNNING_WARNING)
    if ns.speculative_num_steps is None:  # topk / draft tokens without steps: refused above (resolution.py)
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


def adaptive_unsupported_reason(ns: argparse.Namespace) -> str | None:
    """Why SGLang switches adaptive speculation off (adaptive_spec_params.py adaptive_unsupported_reason)."""
    if ns.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={ns.speculative_algorithm} (only EAGLE/EAGLE3 are supported)"
    if ns.speculative_eagle_topk is not None and ns.speculative_eagle_topk != 1:
        return f"speculative_eagle_topk={ns.speculative_eagle_topk} (only topk=1 is supported)"
    if ns.enable_dp_attention:
        return "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
    if ns.enable_multi_layer_eagle:
        return "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    if ns.enable_two_batch_overlap:
        return (
            "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend "
            "wrapper)"
        )
    if ns.enable_pdmux:
        return "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
    return None


def _resolve_adaptive(ns: argparse.Namespace, warnings: list[str], fail: Any) -> None:
    """speculative_hook.py _maybe_disable_adaptive and _init_adaptive_speculative_params: switch adaptive off with a
    warning where unsupported; else read the config (a bad file fails the launch), default topk to 1 and the steps to
    the candidate union's median, refuse steps outside the union, and set draft tokens to steps + 1."""
    from rig.sim.adaptive import AdaptiveConfigError, candidate_union, load_config

    reason = adaptive_unsupported_reason(ns)
    if reason is not None:
        warnings.append(f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.")
        ns.speculative_adaptive = False
        return
    try:
        union = candidate_union(load_config(ns.speculative_adaptive_config, ns.sim_sglang_version))
    except AdaptiveConfigError as e:
        fail(str(e))
    if ns.speculative_eagle_topk is None:
        ns.speculative_eagle_topk = 1
    if ns.speculative_num_steps is None:
        ns.speculative_num_steps = union[len(union) // 2]
    if ns.speculative_num_steps not in union:
        fail(
            f"--speculative-num-steps={ns.speculative_num_steps} is not in the adaptive config candidate_steps "
            f"{union}. Pass one of those values."
        )
    ns.speculative_num_draft_tokens = ns.speculative_num_steps + 1


def context_length_allowed(requested: int, model_max: int) -> bool:
    """Above the model's maximum only with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, like SGLang."""
    return requested <= model_max or os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") == "1"


def main_error(msg: str, code: int = 1) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    raise SystemExit(code)
