"""vit.train.contrastive: CLIP's and SigLIP's losses against open_clip's ClipLoss / SigLipLoss on one process, and
two and three gloo processes with their share of the batch each against one process with the whole batch (loss
and gradients, float64), SigLIP's negatives gathered or passed around the ring (two processes: the one-way step;
three: the two-way round).

The two-process run is a tiny two-tower model (a linear image and text projection, logit scale and bias): each
process computes its half's features and loss, backpropagates, and averages the gradients as DDP does; rank 0
writes the averaged loss and gradients for the parent to compare with the single-process run.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import end_gloo_worker
from torch import nn

from vit.train.contrastive import clip_loss, siglip_loss

N, E = 12, 6  # N divisible by 2 and 3 processes


def _features(n=N, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(n, E, generator=g, dtype=dtype), dim=-1)
    text = F.normalize(image + 0.8 * torch.randn(n, E, generator=g, dtype=dtype), dim=-1)  # pairs correlated
    return image, text


def test_losses_equal_open_clip_on_one_process():
    open_clip_loss = pytest.importorskip("open_clip.loss")
    image, text = _features()
    scale, bias = torch.tensor(7.5, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    for ours, theirs, args in [(clip_loss, open_clip_loss.ClipLoss(), (scale,)),
                               (siglip_loss, open_clip_loss.SigLipLoss(), (scale, bias))]:
        a = [t.clone().requires_grad_() for t in (image, text)]
        b = [t.clone().requires_grad_() for t in (image, text)]
        mine, ref = ours(*a, *args), theirs(*b, *args)
        torch.testing.assert_close(mine, ref, atol=1e-12, rtol=0)
        mine.backward(), ref.backward()
        for x, y in zip(a, b):
            torch.testing.assert_close(x.grad, y.grad, atol=1e-12, rtol=0)
        assert 0.1 < ref.item() < 50  # not vacuous: an ordinary loss value


class Towers(nn.Module):
    """Two projections and the contrastive scale and bias: what the losses' gradients reach."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.image, self.text = nn.Linear(5, E).double(), nn.Linear(4, E).double()
        self.logit_scale = nn.Parameter(torch.tensor(2.0, dtype=torch.float64))
        self.logit_bias = nn.Parameter(torch.tensor(-1.5, dtype=torch.float64))

    def loss(self, kind, x_image, x_text):
        image, text = F.normalize(self.image(x_image), dim=-1), F.normalize(self.text(x_text), dim=-1)
        if kind == "clip":
            return clip_loss(image, text, self.logit_scale.exp())
        return siglip_loss(image, text, self.logit_scale.exp(), self.logit_bias,
                           exchange="ring" if kind == "siglip-ring" else "gather")


KINDS = ("clip", "siglip", "siglip-ring")


def _batch():
    g = torch.Generator().manual_seed(5)
    return torch.randn(N, 5, generator=g, dtype=torch.float64), torch.randn(N, 4, generator=g, dtype=torch.float64)


def _worker(rank, world, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        x_image, x_text = _batch()
        rows = slice(rank * N // world, (rank + 1) * N // world)
        results = {}
        for kind in KINDS:
            model = Towers()
            loss = model.loss(kind, x_image[rows], x_text[rows])
            loss.backward()
            dist.all_reduce(loss.detach_(), op=dist.ReduceOp.SUM)
            for p in model.parameters():  # DDP's averaging (CLIP's loss has no bias: no gradient for it)
                if p.grad is None:
                    continue
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
            results[kind] = (loss / world, {k: p.grad.clone() for k, p in model.named_parameters()
                                             if p.grad is not None})
        if rank == 0:
            torch.save(results, out_file)
        dist.barrier()  # no process leaves while another still talks to it
    except BaseException:
        dist.destroy_process_group()
        raise
    end_gloo_worker()


def test_ring_on_one_process_is_the_gathered_loss():
    image, text = _features()
    scale, bias = torch.tensor(7.5, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    torch.testing.assert_close(siglip_loss(image, text, scale, bias, exchange="ring"),
                               siglip_loss(image, text, scale, bias), atol=0, rtol=0)
    with pytest.raises(ValueError, match="unknown exchange 'all'; use 'gather' or 'ring'"):
        siglip_loss(image, text, scale, bias, exchange="all")


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_the_ring_never_has_two_operations_pending_between_two_processes_under_one_tag(monkeypatch, world):
    """Each batch of point-to-point operations the ring issues, forward and backward, recorded on every rank: no
    two name the same peer and tag (with two processes the one-way round sends to and receives from the same
    peer at once, both under tag 0, and gloo matches a message by its peer and tag alone), and every send is met
    by a receive of the same tag on its peer."""
    import vit.train.contrastive as contrastive

    batches = []

    class Op:
        def __init__(self, op, tensor, peer, tag=0):
            self.kind, self.peer, self.tag = "send" if op is dist.isend else "recv", peer, tag

    for rank in range(world):
        monkeypatch.setattr(contrastive, "_world", lambda rank=rank: (rank, world))
        monkeypatch.setattr(dist, "P2POp", Op)
        monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops, rank=rank: batches.append((rank, ops)) or [])
        image, text = (t[:2].clone().requires_grad_() for t in _features())
        siglip_loss(image, text, torch.tensor(7.5, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64),
                    exchange="ring").backward()
    sends, recvs = set(), set()
    for rank, ops in batches:
        pending = [(op.peer, op.tag) for op in ops]
        assert len(set(pending)) == len(pending), (rank, pending)
        sends |= {(rank, op.peer, op.tag) for op in ops if op.kind == "send"}
        recvs |= {(op.peer, rank, op.tag) for op in ops if op.kind == "recv"}
    assert sends == recvs and len(sends) == world * (2 if world > 2 else 1)  # each ordered pair its own tag


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_processes_equal_one_with_the_whole_batch(tmp_path, monkeypatch, world):
    """Loss and every parameter's gradient within 1e-6 (float64), CLIP's and SigLIP's (gathered and ring), gloo on
    CPU."""
    import torch.multiprocessing as mp

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path / "out.pt")), nprocs=world, join=True)
    results = torch.load(tmp_path / "out.pt", weights_only=True)
    x_image, x_text = _batch()
    for kind in KINDS:
        model = Towers()
        loss = model.loss(kind, x_image, x_text)
        loss.backward()
        two_loss, two_grads = results[kind]
        torch.testing.assert_close(two_loss, loss.detach(), atol=1e-6, rtol=0)
        assert set(two_grads) == {k for k, p in model.named_parameters() if p.grad is not None}
        for k, p in model.named_parameters():
            if kind == "clip" and k == "logit_bias":
                continue
            assert p.grad.abs().max() > 1e-4, (kind, k)  # every parameter receives a gradient
            torch.testing.assert_close(two_grads[k], p.grad, atol=1e-6, rtol=0, msg=f"{kind} {k}")


@pytest.mark.slow
def test_the_shapes_example_learns_the_seen_pairs(tmp_path):
    """examples/clip_shapes.py through train.py, 3 epochs (60 steps) of one seed: captions of the pairs it trained
    on are picked for their images well above chance (1/12), through the zero-shot classifier that scores the
    held-out pairs, from the checkpoint train.py wrote."""
    import importlib.util

    from helpers import ROOT

    spec = importlib.util.spec_from_file_location("_example_clip_shapes", ROOT / "examples" / "clip_shapes.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.run(0, tmp_path, ["--run.epochs=3", "--run.eval_every=3", "--data.num_workers=0"])
    assert result["seen"] > 2 * result["chance"], result
