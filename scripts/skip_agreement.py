"""Do two seeds learn the same content skip, or only skips of the same size?

In the study, each layer's ||W_skip|| agrees across seeds to three or four digits although the seeds see the
data in different orders. That can mean the seeds find the same matrices, or only that a norm over d x d
entries concentrates whatever the matrices are. This reads W_skip from trained adapters and reports, per
layer, each seed's norm and the cosine similarity of every pair of seeds: 1 is the same direction, and two
unrelated d x d matrices give a cosine within about ±1/d (the chance level, printed with the results).

  .venv/bin/python scripts/skip_agreement.py results/study-cpu/preproj+skip-seed42 \
      results/study-cpu/preproj+skip-seed43 --out results/skip-agreement/preproj+skip
"""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path

import torch
from safetensors import safe_open

from preproj.runtime.files import atomic_write, write_json

SKIP_KEY = re.compile(r"layers\.(\d+)\.skip\.weight$")


def skip_matrices(adapter: Path) -> list[torch.Tensor]:
    """W_skip of every layer, in layer order, as float32."""
    path = adapter / "adapter_model.safetensors"
    if not path.is_file():
        raise SystemExit(f"{path} not found: give the directories of trained adapters (METHOD-seedN in a compare run).")
    with safe_open(str(path), framework="pt") as f:
        found = {int(m.group(1)): k for k in f.keys() if (m := SKIP_KEY.search(k))}
        if not found:
            raise SystemExit(f"{path} has no W_skip (layers.N.skip.weight): use adapters of skip or preproj+skip.")
        return [f.get_tensor(found[i]).float() for i in sorted(found)]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a.flatten() @ b.flatten() / (a.norm() * b.norm()))


def agreement(adapters: list[Path]) -> dict:
    skips = [skip_matrices(a) for a in adapters]
    if len({len(s) for s in skips}) != 1:
        raise SystemExit("The adapters have different numbers of layers: compare runs of the same model.")
    pairs = list(itertools.combinations(range(len(adapters)), 2))
    layers = []
    for i in range(len(skips[0])):
        mats = [s[i] for s in skips]
        layers.append({"layer": i, "norms": [float(m.norm()) for m in mats],
                       "cosines": {f"{adapters[a].name}~{adapters[b].name}": cosine(mats[a], mats[b])
                                   for a, b in pairs}})
    d = skips[0][0].shape[0]
    return {"adapters": [str(a) for a in adapters], "chance_cosine": 1 / d, "layers": layers}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [x["layer"] for x in result["layers"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for k, name in enumerate(result["adapters"]):
        left.plot(layers, [x["norms"][k] for x in result["layers"]], marker="o", label=Path(name).name)
    left.set_xlabel("layer")
    left.set_ylabel("||W_skip||_F")
    left.legend()
    for pair in result["layers"][0]["cosines"]:
        right.plot(layers, [x["cosines"][pair] for x in result["layers"]], marker="o", label=pair)
    right.axhline(result["chance_cosine"], color="grey", linestyle=":", label="unrelated matrices (±1/d)")
    right.set_xlabel("layer")
    right.set_ylabel("cosine similarity between seeds")
    right.set_ylim(0, 1)
    right.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapters", nargs="+", type=Path, help="two or more adapter directories (one per seed)")
    parser.add_argument("--out", type=Path, required=True, help="directory for agreement.json and agreement.png")
    args = parser.parse_args()
    if len(args.adapters) < 2:
        parser.error("give at least two adapters to compare")
    result = agreement(args.adapters)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "agreement.json", result)
    plot(result, args.out / "agreement.png")
    print(f"{'layer':>5} | " + " | ".join(f"norm {Path(a).name}" for a in result["adapters"])
          + " | cosine (mean over pairs)")
    for x in result["layers"]:
        cos = list(x["cosines"].values())
        print(f"{x['layer']:>5} | " + " | ".join(f"{n:.4f}" for n in x["norms"]) + f" | {sum(cos) / len(cos):.3f}")
    print(f"two unrelated matrices of this size would give a cosine within about ±{result['chance_cosine']:.4f} "
          f"(1/d); written to {args.out}")


if __name__ == "__main__":
    main()
