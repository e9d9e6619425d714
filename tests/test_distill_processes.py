"""Distillation across processes: two gloo processes, each with half of the global batch, through Accelerate's
prepare (the student and feature kd's projection wrapped by DistributedDataParallel, the teacher replicated and
never prepared, the loader sharded), take the same first steps as one process with the whole batch and no
wrapper: the loss of each step, the averaged gradients of the first and the weights after each step within 1e-6,
for logit, feature (with its projection) and token (DeiT) distillation. float64 models; SGD, so that a rounding
difference in a near-zero gradient cannot be blown up by Adam's normalisation into a different step."""

import contextlib
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from helpers import end_gloo_worker, perturb
from test_distill_task import STUDENT, _teacher

from vit.config import load_config
from vit.models.build import build_model
from vit.train.tasks import task_for

pytestmark = pytest.mark.slow

KINDS = {"logit": ["--distill.temperature=2.0", "--distill.task_weight=0.3"],
         "feature": ["--distill.kind=feature", "--distill.features=patch"],
         "token": ["--distill.kind=token", "--model.dist_token=true"]}
GLOBAL_BATCH, STEPS, CLASSES = 8, 2, 3


def _setup(folder, kind):
    """(task, student, its extra modules) as train.py builds them for `kind`, the same in every process."""
    cfg = load_config(None, [*STUDENT, f"--distill.teacher={folder}", "--model.drop_path_rate=0",
                             "--aug.label_smoothing=0.1", *KINDS[kind]])
    torch.manual_seed(1)
    student = perturb(build_model(cfg, CLASSES)).train().double()
    task = task_for(cfg, [f"c{i}" for i in range(CLASSES)], None, student)
    task.teacher.double()
    extras = {k: m.double() for k, m in task.extra_modules().items()}
    return task, student, extras


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(GLOBAL_BATCH * STEPS, 3, 32, 32, generator=g, dtype=torch.float64)
    return x, torch.randint(0, CLASSES, (GLOBAL_BATCH * STEPS,), generator=g)


def _weights(modules):
    return {f"{name}.{k}": p.detach().clone() for name, m in modules.items() for k, p in m.named_parameters()}


def _grads(modules):
    return {f"{name}.{k}": p.grad.clone() for name, m in modules.items() for k, p in m.named_parameters()
            if p.grad is not None}


def _steps(folder, kind, accelerator=None):
    """{'loss': [per step], 'grads': first step's, 'weights': [after each step], 'teacher': its weights after};
    with `accelerator`: prepared as train.py prepares (data.batch_size per process), else one process, no wrapper."""
    task, student, extras = _setup(folder, kind)
    params = [p for m in (student, *extras.values()) for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.5, momentum=0.9)
    per_process = GLOBAL_BATCH // (accelerator.num_processes if accelerator else 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_data()), batch_size=per_process)
    run = SimpleNamespace(model=student, extras=extras, accelerator=SimpleNamespace(autocast=contextlib.nullcontext))
    if accelerator is not None:
        model, optimizer, loader, *prepared = accelerator.prepare(student, optimizer, loader, *extras.values())
        run = SimpleNamespace(model=model, extras=dict(zip(extras, prepared)), accelerator=accelerator)
    named = {"student": student, **extras}
    out = {"loss": [], "weights": []}
    for x, y in loader:
        loss = task.loss(run, x, y)
        if accelerator is not None:
            accelerator.backward(loss)
            loss = accelerator.reduce(loss.detach(), "mean")
        else:
            loss.backward()
        out["loss"].append(loss.detach().double())
        out.setdefault("grads", _grads(named))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["weights"].append(_weights(named))
    out["teacher"] = _weights({"teacher": task.teacher.model})
    return out


def _worker(rank, world, folder, out_file):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_file}.init", rank=rank, world_size=world)
    try:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)  # takes the process group above: MULTI_CPU on gloo
        assert accelerator.num_processes == world
        results = {kind: _steps(folder, kind, accelerator) for kind in KINDS}
        gathered = [None] * world
        dist.all_gather_object(gathered, results["feature"]["teacher"])
        assert all(torch.equal(gathered[0][k], g[k]) for g in gathered for k in g), "the teacher differs by process"
        if rank == 0:
            torch.save(results, out_file)
        dist.barrier()  # no process leaves while another still talks to it
    except BaseException:
        dist.destroy_process_group()
        raise
    end_gloo_worker()


def test_two_processes_take_the_first_steps_of_one_with_the_whole_batch(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    folder = _teacher(tmp_path / "teacher")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    mp.spawn(_worker, args=(2, str(folder), str(tmp_path / "out.pt")), nprocs=2, join=True)
    two = torch.load(tmp_path / "out.pt", weights_only=True)
    for kind in KINDS:
        one = _steps(folder, kind)
        got = two[kind]
        assert len(got["loss"]) == len(one["loss"]) == STEPS, kind
        torch.testing.assert_close(torch.stack(got["loss"]), torch.stack(one["loss"]), atol=1e-6, rtol=0)
        assert one["grads"].keys() == got["grads"].keys() and len(one["grads"]) > 10, kind
        if kind == "feature":
            assert any(k.startswith("projection.") for k in one["grads"])  # the projection trains and is synced
        for k, g in one["grads"].items():
            torch.testing.assert_close(got["grads"][k], g, atol=1e-6, rtol=0, msg=f"{kind} {k}")
        for step in range(STEPS):
            for k, w in one["weights"][step].items():
                torch.testing.assert_close(got["weights"][step][k], w, atol=1e-6, rtol=0, msg=f"{kind} {k} {step}")
        moved = max((one["weights"][-1][k] - w).abs().max() for k, w in _weights(
            {"student": _setup(folder, kind)[1]}).items())
        assert moved > 1e-2, kind  # not vacuous: the steps changed the student
        for k, w in one["teacher"].items():  # the teacher never trains, in either run
            torch.testing.assert_close(got["teacher"][k], w, atol=0, rtol=0)
