"""The diagnosis metrics: balanced accuracy, sensitivity, specificity and AUC, per scan and per subject,
each scan counted once; and that ADNI runs report them and pick checkpoints by balanced accuracy."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_hybrid.metrics import DiagnosisMetrics, diagnosis_metrics


def logits_for(p_class1: list[float]) -> torch.Tensor:
    p = torch.tensor(p_class1)
    return torch.stack([torch.log1p(-p), torch.log(p)], dim=1)


def test_always_answering_the_majority_scores_its_share_in_accuracy_and_chance_in_balanced_accuracy():
    """pMCI vs sMCI in paper 003's cohort: 172 vs 232 subjects; always answering sMCI."""
    targets = torch.tensor([1] * 172 + [0] * 232)  # 1 = pMCI (the disease)
    m = diagnosis_metrics(torch.zeros(404), targets)
    assert m["acc"].item() == pytest.approx(232 / 404, abs=1e-4)  # 0.574
    assert m["bacc"].item() == 0.5 and m["sensitivity"].item() == 0.0 and m["specificity"].item() == 1.0
    assert m["auc"].item() == 0.5


def test_metrics_against_a_hand_count():
    scores = torch.tensor([0.9, 0.7, 0.4, 0.2, 0.6, 0.1])
    targets = torch.tensor([1, 1, 1, 0, 0, 0])
    m = diagnosis_metrics(scores, targets)
    assert m["sensitivity"].item() == pytest.approx(2 / 3) and m["specificity"].item() == pytest.approx(2 / 3)
    assert m["bacc"].item() == pytest.approx(2 / 3)
    assert m["auc"].item() == pytest.approx(8 / 9)  # pairs (positive, negative) ranked right: 8 of 9
    only_positive = diagnosis_metrics(torch.tensor([0.9, 0.2]), torch.tensor([1, 1]))
    assert only_positive["bacc"].item() == 0.5 and math.isnan(only_positive["specificity"]) and math.isnan(only_positive["auc"])


def test_each_scan_counts_once_and_subjects_average_their_scans():
    metric = DiagnosisMetrics(positive_class=0)  # ClinicaDL's order: AD is class 0
    # scans 0-3 of subjects 10 (AD, two scans), 11 (CN), 12 (CN); scan 3 repeated (a sampler's padding)
    metric.update(logits_for([0.2, 0.6, 0.8]), torch.tensor([0, 0, 1]), torch.tensor([[0, 10], [1, 10], [2, 11]]))
    metric.update(logits_for([0.3, 0.3]), torch.tensor([1, 1]), torch.tensor([[3, 12], [3, 12]]))
    m = metric.compute()
    # per scan, the disease's score is p(class 0): 0.8, 0.4 (AD), 0.2, 0.7 (CN) -> AD recall 1/2, CN recall 1/2
    assert m["sensitivity"].item() == 0.5 and m["specificity"].item() == 0.5 and m["acc"].item() == 0.5
    # per subject: AD mean 0.6 (right), CN 0.2 (right), CN 0.7 (wrong)
    assert m["subject/sensitivity"].item() == 1.0 and m["subject/specificity"].item() == 0.5
    assert m["subject/bacc"].item() == 0.75


def test_keys_are_optional():
    metric = DiagnosisMetrics()
    metric.update(logits_for([0.9, 0.1]), torch.tensor([1, 0]))
    m = metric.compute()
    assert m["bacc"].item() == 1.0 and "subject/bacc" not in m
    with pytest.raises(ValueError, match=r"logits of shape \(batch, 2\)"):
        metric.update(torch.zeros(2, 3), torch.tensor([0, 1]))
