"""The arguments of `preproj compare` and its presets: one budget, precision and evaluation for every method."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.precision import DeviceArgs

PRESETS = {
    # Sized for the embedded SmolLM2-135M on 2 CPU cores (README gives its time, measured, with the CPU).
    # One precision trains every method; one evaluates every method, the base included (the two load the
    # base in the same dtype, so the base is exactly the model the methods were trained on).
    "cpu": {
        "precision": "auto",
        "eval_precision": "fp32",
        "train": dict(data="wikitext2", packing="pack", seq_len=256, batch_size=4, grad_accum=1, steps=32, lr=3e-4,
                      warmup=4, eval_every=8, eval_batches=4, save_every=8),
        "eval": dict(protocol="harness", limits={"lambada": 200, "hellaswag": 100, "arc_easy": 200, "wikitext": 2},
                     max_length=2048),
    },
    # The CPU study (results/study-cpu): clean splits (train on WikiText-2 train, pick learning rates on raw valid,
    # report on raw test and the full evaluation sets), 262,144 training tokens per run, 3 seeds for the
    # methods that matter most. Hours on 2 cores; every run and sweep point resumes where it stopped. fp32
    # throughout, so that runs made in parts on different machines are alike.
    "study": {
        "precision": "fp32",
        "eval_precision": "fp32",
        "train": dict(data="wikitext2-train", packing="pack", seq_len=256, batch_size=4, grad_accum=1, steps=256,
                      lr=3e-4, warmup=16, eval_every=64, eval_batches=8, save_every=32),
        # wikitext_file: the test documents also in the training text's format, where the paper measures
        "eval": dict(protocol="harness", limits={}, max_length=2048, extra_tasks=("wikitext_file",)),
        "lr_sweep": "1e-4,3e-4,1e-3,3e-3", "sweep_steps": 64, "sweep_seeds": 2, "seeds": 3,
        # Every method at its own swept rate, and the two the rate confounds also at preproj+skip's 3e-4,
        # the common rate; 3 seeds each. results/study-cpu/analysis_plan.json declares the comparisons among them.
        "methods": "base,preproj+skip,lora,skip,preproj,preproj+lora,lora@3e-4,skip@3e-4",
    },
    # The paper's exact protocol (docs/method.md: the frozen probe) on whatever device is present: 4 x 4 x 512
    # tokens per step; several processes split the 4 sequences of each micro-batch between them.
    "paper": {
        "precision": "bf16-true",
        "eval_precision": "bf16-true",
        "train": dict(data="wikitext103", lines=2000, packing="lines", seq_len=512, batch_size=4, grad_accum=4,
                      steps=500, lr=1e-5, warmup=50, activation_checkpointing=True, eval_every=50, save_every=50),
        "eval": dict(protocol="paper", limits={}, max_length=None),
    },
}


@dataclass
class CompareArgs(DeviceArgs):
    """Arguments of `preproj compare` (the device group's for training and scoring alike)."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    methods: str | None = None
    """Comma-separated: base, lora, preproj, skip, preproj+skip, preproj+lora; METHOD@LR trains METHOD at that peak
    learning rate instead of the swept one (its runs are METHOD@LR-seedN). Default: the preset's, else all six."""
    seeds: int | None = None
    """Seeds (42, 43, ...) per method of --seeded-methods; default: the preset's (cpu, paper: 1; study: 3). Two give
    the paired intervals t(1)'s quantile, wider than one seed's or three's (compare warns)."""
    seeded_methods: str | None = None
    """Comma-separated methods that get --seeds seeds, the others one; default: the preset's (all trained methods)."""
    preset: str = "cpu"
    """cpu (the embedded model on 2 cores: README's main job), study (the decisive CPU study: hours, resumable) or
    paper (docs/method.md: the frozen probe, for a GPU)."""
    lr_sweep: str | None = None
    """Comma-separated peak learning rates; each method trains at the one with the lowest held-out loss on the
    training data's validation text after --sweep-steps. Default: the preset's (study: 1e-4,3e-4,1e-3,3e-3);
    'none': --lr."""
    sweep_steps: int | None = None
    """Training steps of each sweep run (default: the preset's, else a quarter of the training steps)."""
    sweep_seeds: int | None = None
    """Seeds (42, 43, ...) for each method's best two sweep rates after seed 42; the choice is the lower mean over
    them, so that a difference smaller than the seeds' spread does not decide. Default: the preset's, else 1."""
    steps: int | None = None
    """Override the preset's training steps."""
    limit: int | None = None
    """Override the preset's evaluation items per task."""
    lr: float | None = None
    """Override the preset's peak learning rate."""
    precision: str | None = None
    """Override the preset's training precision (auto, fp32, bf16-mixed, bf16-true, bf16-frozen), the same for every
    method."""
    eval_precision: str | None = None
    """Override the preset's evaluation precision, the same for every method and the base; it must load the base
    in the training precision's dtype."""
    strategy: str = "ddp"
    """Under torchrun: ddp or fsdp for the training runs (evaluation splits items across processes)."""
    report_to: str = "none"
    """Experiment trackers for every training run: none, tensorboard, wandb, trackio (comma-separated)."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR."""
    out: str = "runs/compare"
    """Output directory."""
    fill_missing: bool = False
    """Score the tasks a finished run lacks (a task the preset added after it ran): retrain it from its recorded
    arguments, as its weights are not kept, and score them only if the retrained weights are the ones its other tasks
    scored, bit for bit (their recorded SHA-256); otherwise leave it as it was and say so. The base needs no
    training."""
    report_only: bool = False
    """Write the report from the (method, seed) runs finished so far in --out, training and evaluating nothing; the
    runs still to come are listed. Safe while the comparison itself runs."""
