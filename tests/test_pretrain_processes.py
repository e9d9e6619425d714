"""Pretraining across processes: two gloo processes, each with half of the global batch, prepared by Accelerate as
train.py prepares them, take the same first steps as one process with the whole batch, for DINO (student, head,
EMA teacher and centre) and MAE (encoder and decoder): the loss of each step, the averaged gradients of the first,
the weights, the teacher and the centre after each step within 1e-6. Both tasks run the student unwrapped
(Task.bypasses_wrapper), which DistributedDataParallel never sees; the loop's `average_gradients` is what keeps the
processes in step (without it the test fails: each process would step on its own half). float64, SGD."""

import contextlib
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from helpers import end_gloo_worker, perturb

from vit.config import load_config
from vit.models import create_model
from vit.train.engine import average_gradients
from vit.train.tasks.mae import MAETask
from vit.train.tasks.pretrain import DinoTask

pytestmark = pytest.mark.slow

GLOBAL_BATCH, STEPS = 8, 2
METHODS = {
    # iBOT's masks and KoLeo's nearest neighbours are drawn / found per process (as in DINOv2), so they are off here
    "dino": ["--pretrain.method=dino", "--pretrain.out_dim=64", "--pretrain.hidden_dim=32",
             "--pretrain.bottleneck_dim=16", "--pretrain.local_crops=2", "--pretrain.local_size=16",
             "--pretrain.koleo_weight=0", "--pretrain.ibot_weight=0", "--pretrain.collapse_spread=0"],
    "mae": ["--pretrain.method=mae", "--pretrain.decoder_dim=16", "--pretrain.decoder_depth=1"],
}


def _setup(root, method):
    cfg = load_config("configs/default.yaml", ["--data.dataset=imagefolder", f"--data.root={root}",
                                               *METHODS[method]])
    torch.manual_seed(1)
    model = perturb(create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=16, depth=1,
                                 num_heads=2, num_classes=0, dynamic_img_size=True)).train().double()
    task = (DinoTask if method == "dino" else MAETask).from_config(cfg, [], model=model)
    extras = {k: m.double() for k, m in task.extra_modules().items()}
    if method == "dino":
        task.teacher.double(), task.teacher_head.double(), task.dino.double()
    else:  # the mask from each image's own pixels, not a process's random stream
        reconstruct = task.reconstruct
        task.reconstruct = lambda enc, dec, x, noise=None: reconstruct(enc, dec, x, (x.flatten(1)[:, :16] * 997).frac())
    return cfg, task, model, extras


def _data(method):
    g = torch.Generator().manual_seed(3)
    n = GLOBAL_BATCH * STEPS
    if method == "mae":
        return (torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64),)
    crops = [torch.randn(n, 3, s, s, generator=g, dtype=torch.float64) for s in (32, 32, 16, 16)]
    return crops


class _Crops(torch.utils.data.Dataset):
    def __init__(self, tensors):
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, i):
        items = [t[i] for t in self.tensors]
        return (items if len(items) > 1 else items[0]), 0


def _params(modules, grads=False):
    return {f"{name}.{k}": (p.grad if grads else p).detach().clone() for name, m in modules.items()
            for k, p in m.named_parameters() if not grads or p.grad is not None}


def _steps(root, method, accelerator=None):
    cfg, task, model, extras = _setup(root, method)
    optimizer = torch.optim.SGD([p for m in (model, *extras.values()) for p in m.parameters()], lr=0.5, momentum=0.9)
    per_process = GLOBAL_BATCH // (accelerator.num_processes if accelerator else 1)
    loader = torch.utils.data.DataLoader(_Crops(_data(method)), batch_size=per_process)
    acc = accelerator or SimpleNamespace(autocast=contextlib.nullcontext, unwrap_model=lambda m: m, num_processes=1,
                                         device=torch.device("cpu"), reduce=lambda t, _: t)
    prepared_model, prepared = model, extras
    if accelerator is not None:
        prepared_model, optimizer, loader, *rest = accelerator.prepare(model, optimizer, loader, *extras.values())
        prepared = dict(zip(extras, rest))
    run = SimpleNamespace(model=prepared_model, extras=prepared, accelerator=acc, cfg=cfg, task=task,
                          state=SimpleNamespace(step=0), total_steps=STEPS, steps_per_epoch=STEPS,
                          trained_modules=lambda: [prepared_model, *prepared.values()])
    named = {"model": model, **extras}
    out = {"loss": [], "weights": [], "teacher": [], "centre": []}
    for x, _ in loader:
        loss = task.loss(run, x, None)
        loss.backward()
        out["loss"].append(acc.reduce(loss.detach(), "mean"))
        average_gradients(run)  # what the loop does for a task that bypasses the wrapper
        out.setdefault("grads", _params(named, grads=True))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.state.step += 1
        task.after_step(run)
        out["weights"].append(_params(named))
        if method == "dino":
            out["teacher"].append(_params({"teacher": task.teacher, "teacher_head": task.teacher_head}))
            out["centre"].append(task.dino.centre.detach().clone().double())
    return out


def _worker(rank, world, root, out_file):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_file}.init", rank=rank, world_size=world)
    try:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        assert accelerator.num_processes == world
        results = {method: _steps(root, method, accelerator) for method in METHODS}
        if rank == 0:
            torch.save(results, out_file)
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    end_gloo_worker()


def test_two_processes_take_the_first_steps_of_one_with_the_whole_batch(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    mp.spawn(_worker, args=(2, str(tmp_path), str(tmp_path / "out.pt")), nprocs=2, join=True)
    two = torch.load(tmp_path / "out.pt", weights_only=True)
    for method in METHODS:
        one, got = _steps(tmp_path, method), two[method]
        torch.testing.assert_close(torch.stack(got["loss"]), torch.stack(one["loss"]), atol=1e-6, rtol=0)
        assert one["grads"].keys() == got["grads"].keys() and len(one["grads"]) > 10, method
        for k, g in one["grads"].items():
            torch.testing.assert_close(got["grads"][k], g, atol=1e-6, rtol=0, msg=f"{method} {k}")
        for step in range(STEPS):
            for part in ("weights", "teacher"):
                for k, w in (one[part][step] if one[part] else {}).items():
                    torch.testing.assert_close(got[part][step][k], w, atol=1e-6, rtol=0, msg=f"{method} {k} {step}")
            if one["centre"]:
                assert one["centre"][step].abs().max() > 0  # the centre moved
                torch.testing.assert_close(got["centre"][step], one["centre"][step], atol=1e-6, rtol=0)
        first = _params({"model": _setup(tmp_path, method)[2]})
        moved = max((one["weights"][-1][k] - w).abs().max() for k, w in first.items())
        assert moved > 1e-3, method  # not vacuous: the steps changed the model (1000x the tolerance)
