"""A refactor is numerically invisible (docs/STYLE.md 13): the smoke recipes reproduce, bit for bit,
the weights and losses recorded in tests/fixtures/numerics.json.

The fixture was written by ``python tests/numerics_digest.py --write`` on the commit before the
layout refactor of issue 11 (docs/LOG.md, 2026-12-01). The child process runs with CPU-independent
floating point (see tests/numerics_digest.py), so the same bits are expected on any x86-64 CPU. A
change that is meant to alter the numerics re-records the fixture and says so in docs/LOG.md.
"""
import json

from numerics_digest import FIXTURE, digest


def test_smoke_recipes_are_bit_identical_to_the_fixture(tmp_path):
    want = json.load(open(FIXTURE))
    got = digest(str(tmp_path))
    # every number the fixture holds, bit for bit; a metric added later (a new key) is no numerical change
    assert [{k: g.get(k) for k in w} for g, w in zip(got["orl_losses"], want["orl_losses"])] == want["orl_losses"]
    assert len(got["orl_losses"]) == len(want["orl_losses"])
    assert len(want["orl_losses"]) == 4 and sum("loss" in r for r in want["orl_losses"]) >= 2  # it updated
    for part in ("sft_final", "orl_final"):
        diff = sorted(k for k in set(want[part]) | set(got[part]) if want[part].get(k) != got[part].get(k))
        assert not diff, f"{part}: {len(diff)} tensors differ from the fixture, e.g. {diff[:4]}"
    assert want["sft_final"] != want["orl_final"]  # ORL changed the weights: the digest sees training
