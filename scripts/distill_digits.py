"""Knowledge distillation on CPU with data made here: the experiment of docs/training.md (issue 48).

    python scripts/distill_digits.py --out /tmp/kd     # ~13 CPU-minutes at one thread

1. Data: scikit-learn's 1,797 8x8 digits (nothing downloaded) as PNG folders, the stratified 80/20 split of
   configs/default.yaml (seed 0): 1,437 training images, 360 held out. The 360 are every row's test set; no
   checkpoint is picked on them (every score is the last epoch's).
2. The teacher, trained once by train.py on all 1,437 training images: width 192, depth 6, 3 heads (a ViT-S
   shape at this scale), 30 epochs, no label smoothing (a smoothed teacher distils worse, Mueller et al., 2019).
3. Per seed: K labelled images per class (--per-class, 20: 200 images) drawn from the training split with the
   seed. The student (width 64, depth 4, 2 heads: a ViT-Ti shape at this scale, 1/12 of the teacher's
   multiply-adds) trains on them alone, then again from the same initialisation, on the same images, augmentation
   and schedule, with --distill.teacher: the only difference is the teacher's term. The gap is the small labelled
   set: the teacher saw every training label, each student sees K a class; the teacher scores only the images the
   student trains on (their augmented views), never an image outside the student's subset.
4. Speed: the distilled student of the first seed is made INT8 by export.py --quantize int8 (ONNX Runtime, within
   0.5 pt of top-1 on the held-out images; every seed's INT8 top-1 is reported) and timed against the teacher in
   fp32, PyTorch eager and ONNX Runtime, interleaved in this process at one thread, batch 1 and 32 of held-out
   images: the median of the paired repeats' ratios (vit.utils.timing).
Prints the table and writes results.json into --out; finished runs in --out are reused by a second call.

Measured (seeds 0-2; docs/training.md's distillation section has the table): teacher 98.33%; student alone
96.67% (96.39-96.94), distilled 98.33% (98.06-98.61), ahead on every seed, 86-117% of each seed's gap closed;
student INT8 6.5x the teacher's ONNX Runtime fp32 images/s at batch 1 (18.5x its PyTorch eager), 9.1x at 32.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = 64  # the digits upsampled as configs/default.yaml does, patch 16: a 4x4 grid
AUG = ["--aug.interpolation=bicubic", "--aug.random_resized_crop=false", "--aug.affine_translate=0.1",
       "--aug.affine_rotate=10", "--aug.affine_scale=0.1", "--aug.hflip=0"]
COMMON = [f"--model.img_size={SIZE}", "--model.patch_size=16", "--model.mlp_ratio=2", "--data.dataset=imagefolder",
          "--run.num_threads=1", "--data.num_workers=0", "--run.overwrite=true", *AUG]
TEACHER = ["--model.embed_dim=192", "--model.depth=6", "--model.num_heads=3", "--data.batch_size=64",
           "--optim.lr=1e-3", "--optim.warmup_epochs=2", "--aug.label_smoothing=0"]
STUDENT = ["--model.embed_dim=64", "--model.depth=4", "--model.num_heads=2", "--data.batch_size=32",
           "--optim.lr=1e-3", "--optim.warmup_epochs=5"]  # label smoothing 0.1, drop path 0.05: the default's
FEWEST = 139  # training images of the rarest digit (8) in the 80/20 split


def write_digits(data: Path) -> list[tuple[int, Path]]:
    """data/full/{train,val}/<digit>/<index>.png; returns the training images as (label, path)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    imgs = np.clip(d.images * 16, 0, 255).astype(np.uint8)  # (N, 8, 8) as vit.data's digits
    train, val = train_test_split(np.arange(len(imgs)), test_size=0.2, random_state=0, stratify=d.target)
    for split, idx in (("train", train), ("val", val)):
        for i in idx:
            path = data / "full" / split / str(d.target[i]) / f"{i:04d}.png"
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(imgs[i]).save(path)
    return [(int(d.target[i]), data / "full" / "train" / str(d.target[i]) / f"{i:04d}.png") for i in sorted(train)]


def labelled_subset(data: Path, train: list[tuple[int, Path]], per_class: int, seed: int) -> Path:
    """data/seed<s>/: `per_class` training images of each digit drawn with `seed`, and the full held-out split."""
    import numpy as np

    root = data / f"seed{seed}-k{per_class}"
    if (root / "val").is_dir():
        return root
    rng = np.random.default_rng(seed)
    for label in sorted({y for y, _ in train}):
        paths = [p for y, p in train if y == label]
        for i in rng.choice(len(paths), per_class, replace=False):
            (root / "train" / str(label)).mkdir(parents=True, exist_ok=True)
            shutil.copy(paths[i], root / "train" / str(label) / paths[i].name)
    shutil.copytree(data / "full" / "val", root / ".val")
    (root / ".val").rename(root / "val")  # last: a folder with val/ is complete
    return root


def _child_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes of this one."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def train(out: Path, name: str, root: Path, epochs: int, *extra: str) -> dict:
    """A train.py run (skipped when its last/ holds the final epoch); its last epoch's held-out top-1 and time."""
    meta = out / name / "last" / "meta.json"
    if not (meta.is_file() and json.loads(meta.read_text())["epoch"] == epochs):
        t0 = _child_cpu(), time.perf_counter()
        cmd = [sys.executable, str(ROOT / "train.py"), *COMMON, f"--data.root={root}", f"--run.output_dir={out}",
               f"--run.name={name}", f"--run.epochs={epochs}", f"--run.eval_every={epochs}", *extra]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
        took = dict(cpu_s=_child_cpu() - t0[0], wall_s=time.perf_counter() - t0[1])
        (out / name / "took.json").write_text(json.dumps(took))
    m = json.loads(meta.read_text())
    return dict(top1=100 * m["val_acc1"], **json.loads((out / name / "took.json").read_text()))


def export(checkpoint: Path, dst: Path, *extra: str) -> dict:
    """export.py's ONNX (and INT8 with --quantize int8) of a checkpoint; its verification.json."""
    if not (dst / "verification.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "export.py"), "--checkpoint", str(checkpoint), "--out", str(dst),
                        "--threads", "1", *extra], cwd=ROOT, check=True, capture_output=True)
    return json.loads((dst / "verification.json").read_text())["results"]


def speed(teacher: Path, teacher_onnx: Path, student_int8: Path, batches=(1, 32), repeats: int = 7) -> dict:
    """Images/s of the student INT8 (ONNX Runtime) and the teacher fp32 (PyTorch eager and ONNX Runtime) on held-out
    images, one thread, interleaved (the student's ONNX fp32 beside them: what INT8 adds); per batch the median
    (min-max) of the paired repeats' ratios, in the thread's CPU time (steady on a shared machine)."""
    import torch

    from vit.deploy.int8 import labelled_images
    from vit.deploy.quantize import OnnxModel
    from vit.models.checkpoint import load_checkpoint
    from vit.utils.timing import interleaved, ratio_stats

    torch.set_num_threads(1)
    model, cfg, classes, _ = load_checkpoint(teacher)
    images = labelled_images(cfg, classes).x  # (360, 1, 64, 64), the evaluation preprocessing
    sessions = {"teacher_ort_fp32": OnnxModel(teacher_onnx), "student_int8": OnnxModel(student_int8),
                "student_ort_fp32": OnnxModel(student_int8.with_name("model.onnx"))}  # INT8's own share
    res = {}
    for batch in batches:
        x = images[:batch]
        xt = torch.from_numpy(x)

        def eager(xt=xt):
            with torch.inference_mode():
                model(xt)

        calls = {"teacher_eager_fp32": eager, **{k: (lambda s=s, x=x: s(x)) for k, s in sessions.items()}}
        for fn in calls.values():
            fn()  # warm-up
        t0 = time.perf_counter()
        calls["teacher_eager_fp32"]()
        iters = max(1, int(0.3 / max(time.perf_counter() - t0, 1e-6)))  # ~0.3 s a repeat of the slowest
        t = interleaved(calls, 1, repeats, iters).cpu  # one thread: CPU time, steady on a shared machine
        res[batch] = dict(images_per_s={k: batch / statistics.median(v) for k, v in t.items()},
                          over_teacher_eager=ratio_stats(t["student_int8"], t["teacher_eager_fp32"]),
                          over_teacher_ort=ratio_stats(t["student_int8"], t["teacher_ort_fp32"]),
                          int8_over_fp32=ratio_stats(t["student_int8"], t["student_ort_fp32"]))
    return res


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def pair(out: Path, seed: int, per_class: int, epochs: int, kind: str, distill: list[str]) -> tuple[list, list]:
    """(run name, train.py options) of the student alone and of the distilled one for `seed`: the same options
    (model, data, augmentation, schedule, seed) but for the distill.* ones."""
    student = [*STUDENT, *(["--model.dist_token=true"] if kind == "token" else []), f"--run.seed={seed}"]
    tag = f"s{seed}-k{per_class}-e{epochs}{'-dist' if kind == 'token' else ''}"
    kd = [f"--distill.teacher={out / 'teacher' / 'last'}", f"--distill.kind={kind}",
          *(f"--distill.{a}" for a in distill)]
    name = f"{kind}-{tag}-{'_'.join(distill)}"
    return (f"alone-{tag}", student), (name, [*student, *kd])


def run_seed(out: Path, train_images, teacher: dict, seed: int, args) -> dict:
    """Both students of one seed, the distilled one made INT8; prints and returns its row."""
    root = labelled_subset(out / "data", train_images, args.per_class, seed)
    (a_name, a_args), (name, kd_args) = pair(out, seed, args.per_class, args.epochs, args.kind, args.distill)
    alone = train(out, a_name, root, args.epochs, *a_args)
    distilled = train(out, name, root, args.epochs, *kd_args)
    int8 = export(out / name / "last", out / "export" / name, "--quantize", "int8")["int8"]
    gap = teacher["top1"] - alone["top1"]
    row = dict(seed=seed, name=name, alone=alone, distilled=distilled, int8_top1=100 * int8["top1_int8"],
               int8_method=int8["method"], closed=(distilled["top1"] - alone["top1"]) / gap if gap > 0 else None)
    closed = f"{row['closed']:.0%}" if row["closed"] is not None else "n/a (the student alone is not below the teacher)"
    print(f"seed {seed}: student alone {alone['top1']:.2f}%, distilled ({args.kind}) {distilled['top1']:.2f}% "
          f"(INT8 {row['int8_top1']:.2f}%), gap closed {closed}", flush=True)
    return row


def report(teacher: dict, rows: list[dict], fast: dict, kind: str) -> None:
    print(f"\n| model | held-out top-1 %, mean (min, max) over seeds {[r['seed'] for r in rows]} |\n|---|---|")
    print(f"| teacher (one run, seed 0) | {teacher['top1']:.2f} |")
    print(f"| student alone | {spread([r['alone']['top1'] for r in rows])} |")
    print(f"| student distilled ({kind}) | {spread([r['distilled']['top1'] for r in rows])} |")
    print(f"| student distilled, INT8 | {spread([r['int8_top1'] for r in rows])} |")
    closed = [100 * r["closed"] for r in rows if r["closed"] is not None]
    print(f"gap closed: {spread(closed) + ' %' if closed else 'n/a'}; beats alone on every seed: "
          f"{all(r['distilled']['top1'] > r['alone']['top1'] for r in rows)}")
    for batch, s in fast.items():
        e, o = s["over_teacher_eager"], s["over_teacher_ort"]
        print(f"batch {batch}: student INT8 {s['images_per_s']['student_int8']:.0f} img/s = {e['median']:.1f}x the "
              f"teacher fp32 eager ({e['min']:.1f}-{e['max']:.1f}), {o['median']:.1f}x its ONNX Runtime fp32 "
              f"({o['min']:.1f}-{o['max']:.1f}); INT8 {s['int8_over_fp32']['median']:.2f}x the student's fp32")
    cpu = teacher["cpu_s"] + sum(r[k]["cpu_s"] for r in rows for k in ("alone", "distilled"))
    print(f"training CPU time: {cpu / 60:.1f} min (teacher {teacher['cpu_s'] / 60:.1f})")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a scratch folder for the data, the runs and results.json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--per-class", type=int, default=20, help="labelled training images of each digit a student sees")
    ap.add_argument("--epochs", type=int, default=400, help="student epochs, alone and distilled")
    ap.add_argument("--teacher-epochs", type=int, default=30)
    ap.add_argument("--kind", choices=("logit", "feature", "token"), default="logit")
    ap.add_argument("--distill", nargs="*", default=None, metavar="KEY=VALUE",
                    help="more distill.* settings of the distilled student (default: temperature=4, none for "
                         "--kind feature, which reads no temperature; e.g. temperature=2 task_weight=0.5)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The options, each bad one a sentence (argparse's exit 2) before anything is written."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if not 1 <= args.per_class <= FEWEST:
        ap.error(f"--per-class {args.per_class} must lie in 1..{FEWEST}, the training images of the rarest digit")
    if args.epochs < 1 or args.teacher_epochs < 1:
        ap.error("--epochs and --teacher-epochs must be at least 1")
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        ap.error(f"--seeds {args.seeds}: give distinct seeds >= 0")
    if args.distill is None:
        args.distill = [] if args.kind == "feature" else ["temperature=4"]
    if any("=" not in a or "." in a.split("=")[0] or a.startswith("-") for a in args.distill):
        ap.error(f"--distill takes distill.* settings as KEY=VALUE (temperature=4), got {args.distill}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    train_images = write_digits(out / "data")
    teacher = train(out, "teacher", out / "data" / "full", args.teacher_epochs, *TEACHER, "--run.seed=0")
    print(f"teacher: top-1 {teacher['top1']:.2f}% on the 360 held-out images", flush=True)
    rows = [run_seed(out, train_images, teacher, seed, args) for seed in args.seeds]
    export(out / "teacher" / "last", out / "export" / "teacher")
    fast = speed(out / "teacher" / "last", out / "export" / "teacher" / "model.onnx",
                 out / "export" / rows[0]["name"] / "model.int8.onnx")
    report(teacher, rows, fast, args.kind)
    (out / "results.json").write_text(json.dumps(dict(teacher=teacher, rows=rows, speed=fast, args=vars(args)),
                                                 indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
