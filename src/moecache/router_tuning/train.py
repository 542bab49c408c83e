"""Fine-tuning with trl and peft: GRPO (variants hit, tag, harness) or SFT (the control), LoRA
adapters on the router, the experts and the attention projections, then merged.

peft reaches the router and experts through `target_parameters`: the router is a bare
weight and transformers 5 stores the experts fused; the family's adapter names them
(MoeAdapter.lora_parameters).
"""

from __future__ import annotations

import tempfile

import torch

from moecache.model import registry

VARIANTS = ("sft", "hit", "tag", "harness")
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lora_config(tuning: dict, model):
    from peft import LoraConfig

    lora = tuning["lora"]
    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=0.0,  # peft's parameter wrapper (router, experts) allows none
        target_modules=ATTENTION,
        target_parameters=registry.of(model).lora_parameters(),
        task_type="CAUSAL_LM",
    )


def common_args(tuning: dict, settings: dict, out_dir: str) -> dict:
    device = settings["harness"]["device"]
    return {
        "output_dir": out_dir,
        "use_cpu": device == "cpu",
        "bf16": settings["model"]["dtype"] == "bfloat16" and device != "cpu",
        "max_steps": tuning["steps"],
        "learning_rate": tuning["lr"],
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": settings["seed"],
        "data_seed": settings["seed"],
        "dataloader_num_workers": 0,
        "gradient_checkpointing": False,  # trl's default; recomputing costs more than it saves here
        # The load-balancing loss pulls tokens apart over the experts, against the reward;
        # the config sets it for every variant alike (the paper's control included).
        "router_aux_loss_coef": tuning["router_aux_loss_coef"],
    }


def trainer(variant: str, model, tok, rows: list[dict], settings: dict, out_dir: str):
    """trl's trainer for `variant`, its LoRA adapters in place (not yet trained)."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from moecache.router_tuning.reward import CacheReward

    tuning = settings["router_tuning"]
    args = common_args(tuning, settings, out_dir)
    if variant == "sft":
        data = datasets.Dataset.from_list(
            [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]
        )
        config = SFTConfig(
            per_device_train_batch_size=tuning["prompts_per_step"],
            max_length=tuning["prompt_tokens"] + tuning["completion_tokens"] + 16,
            **args,
        )
        return SFTTrainer(
            model=model,
            args=config,
            train_dataset=data,
            processing_class=tok,
            peft_config=lora_config(tuning, model),
        )
    reward = CacheReward(variant, tok, settings)
    generations = tuning["num_generations"]
    config = GRPOConfig(
        per_device_train_batch_size=tuning["prompts_per_step"] * generations,
        num_generations=generations,
        max_completion_length=tuning["completion_tokens"],
        temperature=tuning["temperature"],
        beta=tuning["beta"],
        use_vllm=False,
        **args,
    )
    data = datasets.Dataset.from_list(
        [{"prompt": r["prompt"], "cache_size": r["cache_size"]} for r in rows]
    )
    grpo = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=data,
        processing_class=tok,
        peft_config=lora_config(tuning, model),
    )
    reward.model = grpo.model  # the reward reads the routing of the policy in training
    return grpo


def train(variant: str, model, tok, rows: list[dict], settings: dict):
    """Fine-tune; the peft model (adapters not merged) and trl's per-step log."""
    torch.manual_seed(settings["seed"])
    with tempfile.TemporaryDirectory() as scratch:  # trl wants a folder; nothing is saved
        run = trainer(variant, model, tok, rows, settings, scratch)
        run.train()
    steps = [entry for entry in run.state.log_history if "loss" in entry]
    return run.model, steps


@torch.no_grad()
def merge(peft_model, probe_ids: list[int], device: str):
    """The adapters folded into the base weights; the largest logit difference between the
    adapter model and the merged one on `probe_ids`."""
    x = torch.tensor([probe_ids], device=device)
    peft_model.eval()
    adapted = peft_model(input_ids=x).logits.float()
    merged = peft_model.merge_and_unload()
    gap = (merged(input_ids=x).logits.float() - adapted).abs().max().item()
    merged.config.use_cache = True
    return merged, gap
