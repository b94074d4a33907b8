"""Random PEFT LoRA adapters for tiny models, and HF `peft`'s logits and greedy tokens as the reference."""

from __future__ import annotations

import json
from pathlib import Path

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def make_adapter(base: Path, out: Path, *, r: int = 8, alpha: float = 16.0, targets=ATTENTION + MLP, seed: int = 0,
                 rslora: bool = False, scale: float = 1.0, dtype: torch.dtype = torch.float32, **config) -> Path:
    """A PEFT adapter for the HF model at `base`, its A and B random (`scale`: B's size), saved to `out` in
    `dtype` (PEFT upcasts a bf16 adapter on an fp32 model: the same values)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    model = get_peft_model(hf, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora,
                                          init_lora_weights=False, **config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(scale)
            if "lora_" in name:
                p.data = p.data.to(dtype)
    model.save_pretrained(out)
    return out


def peft_model(base: Path, adapter: Path):
    """HF's model at `base` with the adapter at `adapter` applied by `peft` (fp32, eval)."""
    import transformers
    from peft import PeftModel

    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(hf, adapter).eval()


def peft_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def peft_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             eos_token_id=None)
    return out[0, len(ids):].tolist()


def edit_config(adapter: Path, **changes) -> None:
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))
