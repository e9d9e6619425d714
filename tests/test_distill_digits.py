"""scripts/distill_digits.py, the distillation experiment of docs/training.md: the two students of a seed differ
only by the distill.* options, each seed draws its own labelled subset (the same one on a second call), and a bad
option is one sentence before any work."""

import pytest
from helpers import import_script

digits = import_script("scripts/distill_digits")


@pytest.mark.parametrize("kind", ["logit", "token"])
def test_the_two_students_of_a_seed_differ_only_by_the_teacher(tmp_path, kind):
    (alone, a_args), (name, kd_args) = digits.pair(tmp_path, 1, 20, 160, kind, ["temperature=4"])
    assert alone != name and "--run.seed=1" in a_args
    assert kd_args[:len(a_args)] == a_args  # the alone run's options, in order, then the teacher's
    assert kd_args[len(a_args):] == [f"--distill.teacher={tmp_path / 'teacher' / 'last'}", f"--distill.kind={kind}",
                                     "--distill.temperature=4"]
    assert not any(a.startswith("--distill.") for a in a_args)
    assert ("--model.dist_token=true" in a_args) == (kind == "token")  # DeiT's token for both, or for neither


def test_each_seed_draws_its_own_labelled_subset_and_keeps_it(tmp_path):
    data = tmp_path / "data"
    train = []
    for label in range(3):
        for i in range(6):
            p = data / "full" / "train" / str(label) / f"{label}{i}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"png")
            train.append((label, p))
    (data / "full" / "val" / "0").mkdir(parents=True)
    (data / "full" / "val" / "0" / "v.png").write_bytes(b"png")

    def drawn(root):
        return sorted(p.relative_to(root / "train").as_posix() for p in (root / "train").rglob("*.png"))

    a, b = (digits.labelled_subset(data, train, 2, seed) for seed in (0, 1))
    assert [len(list((a / "train" / str(c)).iterdir())) for c in range(3)] == [2, 2, 2]
    assert drawn(a) != drawn(b) and (a / "val" / "0" / "v.png").is_file()
    kept = drawn(a)
    assert drawn(digits.labelled_subset(data, train, 2, 0)) == kept  # a second call reuses it


@pytest.mark.parametrize("args, words", [
    (["--per-class", "140"], "--per-class 140 must lie in 1..139"),
    (["--per-class", "0"], "--per-class 0 must lie in 1..139"),
    (["--epochs", "0"], "--epochs and --teacher-epochs must be at least 1"),
    (["--seeds", "1", "1"], "give distinct seeds >= 0"),
    (["--distill", "optim.lr=1"], "--distill takes distill.* settings as KEY=VALUE"),
    (["--distill", "temperature"], "--distill takes distill.* settings as KEY=VALUE"),
])
def test_a_bad_option_is_one_sentence(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit):
        digits.parse_args(["--out", str(tmp_path), *args])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert words in err
    assert not any(tmp_path.iterdir())  # nothing written
