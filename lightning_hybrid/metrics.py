"""The metrics of a binary diagnosis, as the field reports them: per scan and per subject.

Accuracy flatters a classifier on unbalanced classes (on pMCI vs sMCI, 172 vs 232 subjects, always
answering sMCI scores 0.574), so diagnosis papers report balanced accuracy (the mean of sensitivity
and specificity), sensitivity (the disease class's recall), specificity (the control class's) and
the area under the ROC curve. :class:`DiagnosisMetrics` accumulates each scan's score, label and
key (its index in the evaluated set and its subject's code), counts each scan once (a distributed
sampler pads the last batches with repeated scans) and reports every metric twice: per scan, and
per subject (a subject's scans' mean score against its label). A torchmetrics ``Metric``: its state
is gathered across processes before :meth:`compute`.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_auroc

#: The metrics :meth:`DiagnosisMetrics.compute` reports (per subject with a ``subject/`` prefix).
NAMES = ("bacc", "sensitivity", "specificity", "auc", "acc")


def diagnosis_metrics(scores: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Balanced accuracy, sensitivity, specificity, AUC and accuracy of disease probabilities ``scores``
    against ``targets`` (1 = disease), at the threshold 0.5. A class absent from ``targets`` leaves its
    recall (and the AUC) NaN, and balanced accuracy is the mean recall over the classes present.

        >>> m = diagnosis_metrics(torch.tensor([0.9, 0.8, 0.4, 0.1, 0.2]), torch.tensor([1, 1, 1, 0, 0]))
        >>> {k: round(float(v), 3) for k, v in m.items()}
        {'bacc': 0.833, 'sensitivity': 0.667, 'specificity': 1.0, 'auc': 1.0, 'acc': 0.8}
    """
    predicted = scores >= 0.5
    positive, negative = targets == 1, targets == 0
    nan = torch.tensor(float("nan"))
    sensitivity = (predicted & positive).sum() / positive.sum() if positive.any() else nan
    specificity = (~predicted & negative).sum() / negative.sum() if negative.any() else nan
    recalls = torch.stack([sensitivity.float(), specificity.float()])
    both = positive.any() and negative.any()
    return {
        "bacc": recalls.nanmean() if recalls.isfinite().any() else nan,
        "sensitivity": sensitivity.float(),
        "specificity": specificity.float(),
        "auc": binary_auroc(scores, targets.long()) if both else nan,
        "acc": (predicted == positive).float().mean() if len(targets) else nan,
    }


class DiagnosisMetrics(Metric):
    """:func:`diagnosis_metrics` per scan and per subject over an evaluation epoch.

    Args:
        positive_class: the class index of the disease (ClinicaDL's order puts AD and pMCI at 0).

    ``update(logits, targets, keys=None)``: logits ``(batch, 2)``, class indices, and optionally keys
    ``(batch, 2)`` of ``[index in the evaluated set, subject code]``. Without keys every scan counts
    as often as it was seen and there are no per-subject metrics.
    """

    full_state_update = False

    def __init__(self, positive_class: int = 1) -> None:
        super().__init__()
        if positive_class not in (0, 1):
            raise ValueError(f"positive_class must be 0 or 1, got {positive_class}")
        self.positive_class = positive_class
        for name in ("scores", "targets", "index", "subject"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, logits: torch.Tensor, targets: torch.Tensor, keys: torch.Tensor | None = None) -> None:
        if logits.ndim != 2 or logits.shape[1] != 2:
            raise ValueError(f"DiagnosisMetrics takes logits of shape (batch, 2), got {tuple(logits.shape)}")
        self.scores.append(torch.softmax(logits.detach().float(), dim=1)[:, self.positive_class])
        self.targets.append((targets == self.positive_class).long())
        missing = torch.full_like(targets, -1)
        self.index.append(keys[:, 0].long() if keys is not None else missing)
        self.subject.append(keys[:, 1].long() if keys is not None else missing)

    def _gathered(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.cat(s) if isinstance(s, list) else s for s in (self.scores, self.targets, self.index, self.subject))

    def compute(self) -> dict[str, torch.Tensor]:
        if isinstance(self.scores, list) and not self.scores:
            return {}
        scores, targets, index, subject = (t.cpu() for t in self._gathered())
        if (index >= 0).all():  # each scan once, whatever the sampler repeated
            _, first = _first_occurrences(index)
            scores, targets, subject = scores[first], targets[first], subject[first]
        result = diagnosis_metrics(scores, targets)
        if (subject >= 0).all():
            codes, inverse = torch.unique(subject, return_inverse=True)
            count = torch.zeros(len(codes)).index_add_(0, inverse, torch.ones_like(scores))
            mean_score = torch.zeros(len(codes)).index_add_(0, inverse, scores) / count
            label = (torch.zeros(len(codes)).index_add_(0, inverse, targets.float()) / count >= 0.5).long()
            result.update({f"subject/{k}": v for k, v in diagnosis_metrics(mean_score, label).items()})
        return result


def _first_occurrences(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct values and the position of each one's first occurrence."""
    unique, inverse = torch.unique(values, return_inverse=True)
    positions = torch.arange(len(values))
    first = torch.full((len(unique),), len(values), dtype=torch.long).scatter_reduce(0, inverse, positions, "amin")
    return unique, first
