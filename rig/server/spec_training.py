"""The training loops and exports behind rig.server.spec_models (torch, transformers, safetensors)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# The names SGLang's LlamaForCausalLMEagle.load_weights receives (it prefixes "model." to all but lm_head): what
# save_eagle writes and tests check.
EAGLE_LAYER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
)


STREAMS = {"target": 0, "draft": 1, "eagle": 2}  # each model's own batch order, fixed by the seed


@dataclass
class Tokens:
    train: torch.Tensor  # int64, one stream, files separated by </s>
    held: torch.Tensor


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def token_stream(tok: Any, texts: list[str], recipe: dict[str, Any]) -> Tokens:
    """The corpus as one token stream; the last ``holdout_fraction`` of it held out (whole files)."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tok(text, add_special_tokens=False)["input_ids"])
        ids.append(tok.eos_token_id)
    cut = int(len(ids) * (1 - recipe["holdout_fraction"]))
    stream = torch.tensor(ids, dtype=torch.int64)
    return Tokens(train=stream[:cut], held=stream[cut:])


def batches(data: torch.Tensor, recipe: dict[str, Any], steps: int, seed: int) -> Iterator[torch.Tensor]:
    """``steps`` batches of ``batch`` windows of ``seq_len`` tokens at offsets from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    n, seq = recipe["batch"], recipe["seq_len"]
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (n,), generator=gen)
        yield torch.stack([data[s : s + seq] for s in starts.tolist()]).to(device())


def llama_config(tok: Any, shape: dict[str, Any], recipe: dict[str, Any]) -> Any:
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        max_position_embeddings=recipe["max_position_embeddings"],
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def _optimizer(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=torch.cuda.is_available())


def _lr_at(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over 5 % of the steps, then cosine down to a tenth."""
    warm = max(1, steps // 20)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def _fit(
    name: str, params: list[nn.Parameter], loss_of: Any, data: Tokens, shape: dict, recipe: dict, log: Any
) -> tuple[float, float]:
    """The shared loop: bf16 autocast, AdamW, warm-up and cosine, gradient clipping; returns the last loss."""
    opt = _optimizer(params, shape["lr"])
    steps, t0, loss = shape["steps"], time.monotonic(), torch.tensor(0.0)
    for i, x in enumerate(batches(data.train, recipe, steps, recipe["seed"] + STREAMS[name])):
        for g in opt.param_groups:
            g["lr"] = _lr_at(i, steps, shape["lr"])
        with torch.autocast(device().type, dtype=torch.bfloat16):
            loss = loss_of(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if i % max(1, steps // 10) == 0 or i == steps - 1:
            log(f"spec_models: {name} step {i + 1}/{steps} loss {loss.item():.3f} ({time.monotonic() - t0:.0f} s)")
    return float(loss.item()), round(time.monotonic() - t0, 1)


def _held_batches(data: Tokens, recipe: dict[str, Any]) -> list[torch.Tensor]:
    return list(batches(data.held, {**recipe, "batch": max(1, recipe["batch"] // 4)}, 4, recipe["seed"] - 1))


def _target_logits(target: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), torch.autocast(device().type, dtype=torch.bfloat16):
        return target(input_ids=x).logits.float()


def train_target(data: Tokens, tok: Any, recipe: dict[str, Any], log: Any) -> tuple[nn.Module, dict]:
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe["seed"])
    model = LlamaForCausalLM(llama_config(tok, recipe["target"], recipe)).to(device())
    model.train()

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x, labels=x).loss

    loss, secs = _fit("target", list(model.parameters()), loss_of, data, recipe["target"], recipe, log)
    model.eval()
    hits = total = 0
    for x in _held_batches(data, recipe):
        pred = _target_logits(model, x)[:, :-1].argmax(-1)
        hits += int((pred == x[:, 1:]).sum())
        total += pred.numel()
    params = sum(p.numel() for p in model.parameters())
    return model, {"loss": loss, "train_s": secs, "params": params, "held_out_next_token_accuracy": hits / total}


def train_draft(data: Tokens, tok: Any, target: nn.Module, recipe: dict[str, Any], log: Any) -> tuple[nn.Module, dict]:
    """A small Llama distilled from the target (forward KL on the target's next-token distribution)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe["seed"] + 1)
    draft = LlamaForCausalLM(llama_config(tok, recipe["draft"], recipe)).to(device())
    draft.train()

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        teacher = F.log_softmax(_target_logits(target, x), -1)
        student = F.log_softmax(draft(input_ids=x).logits.float(), -1)
        return F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")

    loss, secs = _fit("draft", list(draft.parameters()), loss_of, data, recipe["draft"], recipe, log)
    draft.eval()
    agree = total = 0
    for x in _held_batches(data, recipe):
        with torch.no_grad(), torch.autocast(device().type, dtype=torch.bfloat16):
            d = draft(input_ids=x).logits.argmax(-1)
        agree += int((d == _target_logits(target, x).argmax(-1)).sum())
        total += d.numel()
    params = sum(p.numel() for p in draft.parameters())
    return draft, {"loss": loss, "train_s": secs, "params": params, "greedy_agreement_with_target": agree / total}


class EagleHead(nn.Module):
    """SGLang's LlamaForCausalLMEagle body: fc([embed(token), feature]) -> one Llama decoder layer without its input
    norm -> the layer's output (SGLang's ``hidden_states + residual``); logits through the target's LM head."""

    def __init__(self, cfg: Any) -> None:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size * 2, cfg.hidden_size)
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
        self.layer.input_layernorm = nn.Identity()  # llama_eagle.py: layer 0 skips its input_layernorm
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat((emb, feat), dim=-1))
        out = self.layer(
            h, attention_mask=None, position_ids=position_ids, position_embeddings=self.rotary(h, position_ids)
        )
        return out[0] if isinstance(out, tuple) else out


def _features(target: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's last hidden states after its final norm (what SGLang hands the draft) and its logits."""
    with torch.no_grad(), torch.autocast(device().type, dtype=torch.bfloat16):
        out = target.model(input_ids=x)
        feat = out.last_hidden_state
        return feat, target.lm_head(feat).float()


def eagle_steps(head: EagleHead, target: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Two drafting steps as SGLang runs them, teacher-forced: at position t the draft sees token t+1 and the
    target's feature at t (step 1), then token t+2 and its own step-1 output (step 2)."""
    feat, logits = _features(target, x)
    emb = target.model.embed_tokens(x).detach()
    n = x.shape[1]
    pos = torch.arange(n, device=x.device).unsqueeze(0).expand(x.shape[0], -1)
    h1 = head(emb[:, 1:], feat[:, :-1], pos[:, : n - 1])  # predicts the target's feature at t+1
    h2 = head(emb[:, 2:], h1[:, :-1], pos[:, 1 : n - 1])  # predicts the target's feature at t+2
    return h1, h2, {"feat": feat, "logits": logits}


def train_eagle(data: Tokens, target: nn.Module, recipe: dict[str, Any], log: Any) -> tuple[nn.Module, dict]:
    """EAGLE's objective: smooth-L1 on the next feature plus a weighted KL to the target's next-token
    distribution, for the first and (weighted) the second drafting step."""
    torch.manual_seed(recipe["seed"] + 2)
    shape = recipe["eagle"]
    head = EagleHead(target.config).to(device())
    head.train()

    def step_loss(h: torch.Tensor, feat: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        reg = F.smooth_l1_loss(h.float(), feat.float())
        student = F.log_softmax(target.lm_head(h).float(), -1)
        teacher = F.log_softmax(logits, -1)
        kl = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")
        return reg + shape["w_logits"] * kl

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        h1, h2, t = eagle_steps(head, target, x)
        first = step_loss(h1, t["feat"][:, 1:], t["logits"][:, 1:])
        second = step_loss(h2, t["feat"][:, 2:], t["logits"][:, 2:])
        return first + shape["w_second_step"] * second

    loss, secs = _fit("eagle", list(head.parameters()), loss_of, data, {**shape}, recipe, log)
    head.eval()
    agree = [0, 0]
    total = [0, 0]
    for x in _held_batches(data, recipe):
        with torch.no_grad(), torch.autocast(device().type, dtype=torch.bfloat16):
            h1, h2, t = eagle_steps(head, target, x)
            want = t["logits"].argmax(-1)
            for k, (h, off) in enumerate(((h1, 1), (h2, 2))):
                got = target.lm_head(h).argmax(-1)
                agree[k] += int((got == want[:, off:]).sum())
                total[k] += got.numel()
    return head, {
        "loss": loss,
        "train_s": secs,
        "params": sum(p.numel() for p in head.parameters()),
        "step1_greedy_agreement": agree[0] / total[0],
        "step2_greedy_agreement": agree[1] / total[1],
    }


def save_llama(model: nn.Module, out: Path) -> None:
    model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(out)


def eagle_state(head: EagleHead, target: nn.Module) -> dict[str, torch.Tensor]:
    """The EAGLE checkpoint's tensors under the names SGLang's loader expects (embed_tokens, fc, layers.0.*,
    lm_head; no layers.0.input_layernorm, which the model does not have)."""
    layer = head.layer.state_dict()
    state = {"embed_tokens.weight": target.model.embed_tokens.weight, "lm_head.weight": target.lm_head.weight}
    state.update({"fc.weight": head.fc.weight, "fc.bias": head.fc.bias})
    state.update({f"layers.0.{k}": layer[k] for k in EAGLE_LAYER_KEYS})
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in state.items()}


def save_eagle(head: EagleHead, target: nn.Module, out: Path) -> None:
    from safetensors.torch import save_file

    save_file(eagle_state(head, target), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = target.config.to_dict()
    cfg.update(architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1, dtype="bfloat16")
    cfg.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))


def eagle_export_problems(eagle_dir: Path, target_dir: Path) -> list[str]:
    """What in an exported EAGLE head SGLang's LlamaForCausalLMEagle would not load as trained: tensor names,
    shapes against the config, the architecture, and the embedding it shares with the target."""
    from safetensors.torch import load_file

    cfg = json.loads((eagle_dir / "config.json").read_text())
    state = load_file(str(eagle_dir / "model.safetensors"))
    target = load_file(str(next(target_dir.glob("*.safetensors"))))
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    want = {
        "embed_tokens.weight": (cfg["vocab_size"], h),
        "lm_head.weight": (cfg["vocab_size"], h),
        "fc.weight": (h, 2 * h),
        "fc.bias": (h,),
        "layers.0.self_attn.q_proj.weight": (h, h),
        "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h),
        "layers.0.self_attn.o_proj.weight": (h, h),
        "layers.0.mlp.gate_proj.weight": (inter, h),
        "layers.0.mlp.up_proj.weight": (inter, h),
        "layers.0.mlp.down_proj.weight": (h, inter),
        "layers.0.post_attention_layernorm.weight": (h,),
    }
    problems = [f"missing {k}" for k in want if k not in state]
    problems += [f"unexpected {k}" for k in state if k not in want]
    problems += [
        f"{k}: shape {tuple(state[k].shape)}, config says {s}"
        for k, s in want.items()
        if k in state and tuple(state[k].shape) != s
    ]
    if cfg.get("architectures") != ["LlamaForCausalLMEagle"] or cfg.get("num_hidden_layers") != 1:
        problems.append(f"config: architectures {cfg.get('architectures')}, {cfg.get('num_hidden_layers')} layers")
    if "embed_tokens.weight" in state and not torch.equal(
        state["embed_tokens.weight"], target["model.embed_tokens.weight"]
    ):
        problems.append("embed_tokens differs from the target's")
    return problems
