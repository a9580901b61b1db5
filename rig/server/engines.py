"""Engine adapters: everything engine-specific about launching and reading a server.

Each adapter owns its argv, readiness, server-info capture, startup-log parsing, and how it reports speculative
acceptance. The server actor (rig/server/actor.py) is the same for all of them.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

from rig.contracts import StartupFacts, WindowAcceptance
from rig.server import command, spec_schedule, vllm_features
from rig.server.spec import ServerConfig
from rig.sim.prometheus import SIM_BEHIND_METRIC, SIM_LATE_METRIC, SIM_LATE_S


# SGLang's key startup line (scheduler.py; identical 0.5.9..0.5.23); the sim prints the same line.
def _count(text: str) -> int:
    """A count as a log prints it (thousands separated by commas)."""
    return int(text.replace(",", ""))


_SGLANG_CAPACITY_LINE = re.compile(
    r"max_total_num_tokens=(?P<max_total_num_tokens>\d+), chunked_prefill_size=(?P<chunked_prefill_size>-?\d+), "
    r"max_prefill_tokens=(?P<max_prefill_tokens>\d+), max_running_requests=(?P<max_running_requests>\d+), "
    r"context_len=(?P<context_len>\d+), available_(?:gpu|cpu)_mem=(?P<available_mem_gb>[\d.]+) GB"
)


@dataclass(frozen=True)
class EngineAdapter:
    """Base adapter. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str] = ""
    default_api: ClassVar[str] = "openai-completions"
    launches_process: ClassVar[bool] = True
    uses_gpus: ClassVar[bool] = True

    def argv(self, cfg: ServerConfig, host: str, port: int) -> list[str]:
        raise NotImplementedError

    def launch_argv(self, cfg: ServerConfig, host: str, port: int, api_key: str | None) -> list[str]:
        """The argv the server actor starts: ``argv`` with whatever secret the engine takes in it (the actor masks
        it wherever the command is shown)."""
        return self.argv(cfg, host, port)

    def python(self, cfg: ServerConfig) -> str:
        return cfg.python or sys.executable

    def env(self, cfg: ServerConfig) -> dict[str, str]:
        """Extra environment for the engine process (never secrets in argv)."""
        return dict(cfg.env)

    def health_path(self) -> str:
        return "/health"

    def info_paths(self) -> list[str]:
        """GET endpoints whose JSON is recorded in the manifest once the server is healthy."""
        return []

    def parse_startup_log(self, text: str) -> StartupFacts:
        return StartupFacts()

    def window_acceptance(self, before: dict[str, float], after: dict[str, float]) -> WindowAcceptance | None:
        """Acceptance over a point's window from counter deltas (``before``/``after``: metric name -> summed value)."""
        return None

    def clock_lapse(self, before: dict[str, float], after: dict[str, float]) -> str | None:
        """Why the point's figures do not hold to the engine's modelled clock (a simulator its host stalled), from its
        counters before and after the point; a real engine models no clock, so None."""
        return None

    def num_gpus(self, cfg: ServerConfig) -> int:
        return cfg.tp if self.uses_gpus else 0


class SGLangAdapter(EngineAdapter):
    name = "sglang"
    default_api = "sglang-native"  # /generate carries per-request spec_verify_ct and accept length

    def module(self, cfg: ServerConfig) -> list[str]:
        return [self.python(cfg), "-m", "sglang.launch_server"]

    def speculative_args(self, cfg: ServerConfig) -> list[str]:
        if cfg.steps <= 0:
            return []
        if cfg.spec_algorithm.upper() == "NGRAM":
            # NGRAM drafts no steps: its points are labelled by draft tokens (--steps N drafts N unless
            # --num-draft-tokens says otherwise), and its tree width is --speculative-ngram-max-bfs-breadth, which
            # SGLang copies over speculative_eagle_topk whatever that was given (arg_groups/overrides.py
            # _handle_ngram, 0.5.17 and 0.5.23): topk maps to the breadth.
            return [
                "--speculative-algorithm",
                "NGRAM",
                "--speculative-num-draft-tokens",
                str(cfg.num_draft_tokens or cfg.steps),
                "--speculative-ngram-max-bfs-breadth",
                str(cfg.eagle_topk),
            ]
        args = ["--speculative-algorithm", cfg.spec_algorithm]
        if cfg.draft_model_path:
            args += ["--speculative-draft-model-path", cfg.draft_model_path]
        args += [
            "--speculative-num-steps",
            str(cfg.steps),
            "--speculative-eagle-topk",
            str(cfg.eagle_topk),
            "--speculative-num-draft-tokens",
            str(cfg.num_draft_tokens if cfg.num_draft_tokens else cfg.steps + 1),
        ]
        return args

    def argv(self, cfg: ServerConfig, host: str, port: int) -> list[str]:
        argv = self.module(cfg) + [
            "--model-path",
            cfg.model,
            "--tp-size",
            str(cfg.tp),
            "--host",
            host,
            "--port",
            str(port),
            "--enable-metrics",
            # usage.prompt_tokens_details.cached_tokens on the OpenAI routes is null without it
            # (entrypoints/openai/usage_processor.py::calculate_response_usage; off by default in 0.5.23)
            "--enable-cache-report",
        ]
        if cfg.served_model_name:
            argv += ["--served-model-name", cfg.served_model_name]
        argv += self.speculative_args(cfg)
        if cfg.deterministic and "--enable-deterministic-inference" not in cfg.extra_args:
            argv.append("--enable-deterministic-inference")  # honours sampling_seed (sampling_batch_info.py)
        argv += list(cfg.extra_args)  # verbatim: flag spellings change across SGLang versions
        return argv

    def info_paths(self) -> list[str]:
        return ["/server_info", "/model_info"]

    def parse_startup_log(self, text: str) -> StartupFacts:
        found = _SGLANG_CAPACITY_LINE.search(text)
        if not found:
            return StartupFacts()
        return StartupFacts(
            max_total_num_tokens=int(found["max_total_num_tokens"]),
            chunked_prefill_size=int(found["chunked_prefill_size"]),
            max_prefill_tokens=int(found["max_prefill_tokens"]),
            max_running_requests=int(found["max_running_requests"]),
            context_len=int(found["context_len"]),
            available_mem_gb=float(found["available_mem_gb"]),
        )

    def window_acceptance(self, before: dict[str, float], after: dict[str, float]) -> WindowAcceptance | None:
        gen = after.get("sglang:generation_tokens_total", 0.0) - before.get("sglang:generation_tokens_total", 0.0)
        ver = after.get("sglang:spec_verify_calls_total", 0.0) - before.get("sglang:spec_verify_calls_total", 0.0)
        if ver <= 0:
            return None
        return WindowAcceptance(generation_tokens=gen, verify_calls=ver, accept_length=gen / ver)


class SimAdapter(SGLangAdapter):
    """The built-in simulated server: started exactly like sglang.launch_server, with the same flags."""

    name = "sim"
    uses_gpus = False

    def module(self, cfg: ServerConfig) -> list[str]:
        return [sys.executable, "-m", "rig.sim"]  # always the rig's own interpreter

    def argv(self, cfg: ServerConfig, host: str, port: int) -> list[str]:
        argv = super().argv(cfg, host, port)
        if cfg.sim_profile:
            argv += ["--sim-profile", cfg.sim_profile]
        return argv

    def clock_lapse(self, before: dict[str, float], after: dict[str, float]) -> str | None:
        skipped = after.get(SIM_BEHIND_METRIC, 0.0) - before.get(SIM_BEHIND_METRIC, 0.0)
        if skipped > 0:
            return (
                f"the simulator fell {skipped:.2f} s behind its modelled clock (this host was too busy): "
                "its figures understate the modelled hardware"
            )
        late = after.get(SIM_LATE_METRIC, 0.0) - before.get(SIM_LATE_METRIC, 0.0)
        if late > 0:
            return (
                f"the simulator ran {late:,.0f} iteration(s) over {SIM_LATE_S:g} s late (this host was too busy): "
                "the streams' timing then was off by as much"
            )
        return None


class VLLMAdapter(EngineAdapter):
    name = "vllm"
    default_api = "openai-completions"
    # KV-capacity lines (v1/core/kv_cache_utils.py, v1/engine/core.py). 0.32.0 on CPU prints, e.g.
    #   "CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per request: 256.00x"
    #   "init engine (profile, create kv cache, warmup model) took 32.73 s"
    startup_lines: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"(?P<kv_cache_device>[A-Z]+) KV cache size: (?P<kv_cache_tokens>[\d,]+) tokens"),
        re.compile(
            r"Maximum concurrency for (?P<max_model_len>[\d,]+) tokens per request: "
            r"(?P<max_concurrency>[\d.]+)x"
        ),
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<init_engine_s>[\d.]+) s"),
        # v1/engine/core.py:133 "Initializing a V1 LLM engine (v0.32.0) with config: ..., speculative_config=
        # SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3), ..."
        re.compile(
            r"speculative_config=SpeculativeConfig\(method='(?P<spec_method>\w+)'.*?num_spec_tokens=(?P<n>\d+)\)"
        ),
    )
    # config/vllm.py:1058-1075: under data parallelism vLLM drops the batch-size schedule and says so
    schedule_off_line: ClassVar[str] = "Disabling num_speculative_tokens_per_batch_size"

    def argv(self, cfg: ServerConfig, host: str, port: int) -> list[str]:
        argv = [
            self.python(cfg),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            cfg.model,
            "--host",
            host,
            "--port",
            str(port),
            "--tensor-parallel-size",
            str(cfg.tp),
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens (off by default)
        ]
        if cfg.served_model_name:
            argv += ["--served-model-name", cfg.served_model_name]
        if cfg.steps > 0:
            speculative_config: dict[str, Any] = {"method": cfg.spec_method, "num_speculative_tokens": cfg.steps}
            if cfg.spec_method == "ngram":
                speculative_config.update({"prompt_lookup_max": 4, "prompt_lookup_min": 2})
            if cfg.draft_model_path:
                speculative_config["model"] = cfg.draft_model_path
            if cfg.spec_schedule is not None:  # K by batch size (rig/server/spec_schedule.py), steps its ceiling
                speculative_config["num_speculative_tokens_per_batch_size"] = spec_schedule.as_json(cfg.spec_schedule)
            argv += ["--speculative-config", json.dumps(speculative_config, separators=(",", ":"))]
            # Per-request acceptance on the final usage chunk, under metrics.speculative_decoding (experimental in
            # vLLM 0.32; vLLM refuses the flag without --speculative-config, so only with steps > 0; 0.26 has no such
            # flag and would not start: its acceptance comes from the counters alone).
            if vllm_features.has_feature(self.python(cfg)):
                argv += ["--per-request-spec-decode-metrics", "summary"]
        argv += list(cfg.extra_args)
        return argv

    def env(self, cfg: ServerConfig) -> dict[str, str]:
        # vLLM reports usage statistics to its authors over the network by default; a benchmark never should.
        return {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **cfg.env}

    def info_paths(self) -> list[str]:
        return ["/v1/models", "/version"]

    def parse_startup_log(self, text: str) -> StartupFacts:
        """KV capacity from the engine core's log (vLLM 0.32 prints one line on CPU; older GPU builds two)."""
        out = StartupFacts()
        kv, conc, init, spec = (pattern.search(text) for pattern in self.startup_lines)
        if kv:
            out["kv_cache_device"] = kv["kv_cache_device"]
            out["kv_cache_tokens"] = _count(kv["kv_cache_tokens"])
        if conc:
            out["max_model_len"] = _count(conc["max_model_len"])
            out["max_concurrency"] = float(conc["max_concurrency"])
        if init:
            out["init_engine_s"] = float(init["init_engine_s"])
        if spec:
            out["spec_method"] = spec["spec_method"]
            out["num_spec_tokens"] = int(spec["n"])
        if self.schedule_off_line in text:
            out["spec_schedule_disabled"] = True
        return out

    def window_acceptance(self, before: dict[str, float], after: dict[str, float]) -> WindowAcceptance | None:
        """Counter deltas over a window. ``accept_length`` = 1 + accepted/drafts counts only the steps that had a
        draft (ngram proposes nothing when the context has no match); ``tokens_per_step`` = generated tokens per
        decode step over all steps, = generation / (generation - accepted), which is what SGLang's
        generation_tokens / verify_calls measures."""

        def delta(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)

        if "vllm:spec_decode_num_drafts_total" not in after:
            return None  # no speculative decoding on this server
        drafts = delta("vllm:spec_decode_num_drafts_total")
        accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
        proposed = delta("vllm:spec_decode_num_draft_tokens_total")
        generated = delta("vllm:generation_tokens_total")
        # Speculation on but nothing drafted (e.g. ngram finds no match in sampled text): the acceptance length
        # is undefined, and every step committed one token.
        return WindowAcceptance(
            drafts=drafts,
            draft_tokens=proposed,
            accepted_tokens=accepted,
            accept_length=1.0 + accepted / drafts if drafts > 0 else None,
            accept_rate=accepted / proposed if proposed > 0 else None,
            generation_tokens=generated,
            tokens_per_step=generated / (generated - accepted) if generated > accepted else 1.0,
        )

    def num_gpus(self, cfg: ServerConfig) -> int:
        return 0 if cfg.device == "cpu" else cfg.tp


class ExternalAdapter(EngineAdapter):
    """A server the user already runs: nothing is launched; steps are recorded, not applied."""

    name = "external"
    default_api = "openai-completions"
    launches_process = False
    uses_gpus = False

    def argv(self, cfg: ServerConfig, host: str, port: int) -> list[str]:
        return []

    def info_paths(self) -> list[str]:
        return ["/v1/models"]


class CommandAdapter(EngineAdapter):
    """Any OpenAI-compatible server (llama-server, TGI, trtllm-serve, transformers serve) from the user's command
    template (rig/server/command.py). Started, awaited, logged and stopped like sglang and vllm; steps and other
    knobs go wherever the template places them."""

    name = "command"
    default_api = "openai-completions"

    def argv(self, cfg: ServerConfig, host: str, port: int) -> list[str]:
        return command.expand(cfg, host, port)  # {api_key} shown as ***

    def launch_argv(self, cfg: ServerConfig, host: str, port: int, api_key: str | None) -> list[str]:
        return command.expand(cfg, host, port, api_key=api_key)

    def info_paths(self) -> list[str]:
        return ["/v1/models"]

    def num_gpus(self, cfg: ServerConfig) -> int:
        return 0 if cfg.device == "cpu" else cfg.tp


ENGINES: dict[str, EngineAdapter] = {
    e.name: e for e in (SGLangAdapter(), SimAdapter(), VLLMAdapter(), ExternalAdapter(), CommandAdapter())
}


def engine_for(name: str) -> EngineAdapter:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(sorted(ENGINES))}") from None
