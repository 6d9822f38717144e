"""The parameter server's update rule, without processes: accumulation, staleness weights, momentum."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.parameter_server.update_rule import UpdateRule


def test_one_step_per_pushes_per_update_with_their_mean():
    rule = UpdateRule(pushes_per_update=3)
    assert [rule.add(torch.full((2,), float(v)), staleness=0) for v in (1, 2, 6)] == [False, False, True]
    torch.testing.assert_close(rule.take_average(), torch.full((2,), 3.0))
    assert rule.pending == 0


def test_stale_gradients_count_less():
    rule = UpdateRule(pushes_per_update=2, staleness_lr=True)
    rule.add(torch.full((1,), 4.0), staleness=1)  # at most one step old: full weight
    rule.add(torch.full((1,), 4.0), staleness=4)  # four steps old: a quarter
    torch.testing.assert_close(rule.take_average(), torch.tensor([(4.0 + 1.0) / 2]))
    plain = UpdateRule(pushes_per_update=2)
    plain.add(torch.full((1,), 4.0), staleness=1), plain.add(torch.full((1,), 4.0), staleness=4)
    torch.testing.assert_close(plain.take_average(), torch.tensor([4.0]))


def test_momentum_keeps_the_mean_delay_of_the_update():
    rule = UpdateRule(momentum_correction=True, staleness_decay=1.0)  # the mean is the last staleness
    assert rule.momentum_correction == "mean_delay"
    rule.add(torch.zeros(1), staleness=1)
    # momentum 0.9 delays a gradient by 9 steps on average; 1 step of staleness leaves 8: 8 / 9
    assert rule.momentum(0.9) == pytest.approx(8 / 9)
    assert rule.momentum(0.5) == 0.0  # a mean delay of 1 step, all of it the staleness's
    rule.add(torch.zeros(1), staleness=4)
    assert rule.momentum(0.9) == pytest.approx(5 / 6)
    rule.add(torch.zeros(1), staleness=12)
    assert rule.momentum(0.9) == 0.0  # never below zero
    assert rule.momentum(0.0) == 0.0
    assert UpdateRule(staleness_decay=1.0).momentum(0.9) == 0.9  # switched off


def test_momentum_minus_the_implicit_momentum_when_asked_to_subtract():
    rule = UpdateRule(momentum_correction="subtract", staleness_decay=1.0)
    rule.add(torch.zeros(1), staleness=1)
    assert rule.momentum(0.9) == pytest.approx(0.9 - 1 / 2)  # E[tau] = 1: implicit momentum 1/2
    rule.add(torch.zeros(1), staleness=9)
    assert rule.momentum(0.9) == 0.0  # never below zero


def test_staleness_of_the_restart_after_a_sync_is_not_counted():
    rule = UpdateRule(momentum_correction="subtract", staleness_decay=1.0, restart_steps=2)
    for _ in range(2):  # the first two steps of the run: a restart
        assert rule.add(torch.zeros(1), staleness=1)
        rule.take_average()
        assert rule.momentum(0.9) == 0.9
    rule.add(torch.zeros(1), staleness=1)  # the third step's push counts
    assert rule.momentum(0.9) == pytest.approx(0.4)
    rule.take_average()
    rule.synchronized()  # a global sync: the next two steps are a restart again
    rule.add(torch.zeros(1), staleness=3)
    assert rule.momentum(0.9) == pytest.approx(0.4)  # unchanged by the restart's push
    counts_all = UpdateRule(momentum_correction="subtract", staleness_decay=1.0)  # restart_steps=0: every push counts
    counts_all.add(torch.zeros(1), staleness=1)
    assert counts_all.momentum(0.9) == pytest.approx(0.4)


def test_weights_count_samples_of_a_push():
    rule = UpdateRule(pushes_per_update=4)
    assert not rule.add(torch.ones(1), staleness=0, weight=3)
    assert rule.add(torch.full((1,), 5.0), staleness=0, weight=1)
    torch.testing.assert_close(rule.take_average(), torch.tensor([(3 * 1.0 + 5.0) / 4]))


@pytest.mark.parametrize("kwargs", [dict(pushes_per_update=0), dict(pushes_per_update=True), dict(staleness_decay=0),
                                    dict(restart_steps=-1), dict(restart_steps=1.5), dict(momentum_correction="halve")])
def test_bad_settings(kwargs):
    with pytest.raises(ValueError):
        UpdateRule(**kwargs)
