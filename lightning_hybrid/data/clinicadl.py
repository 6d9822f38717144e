"""ClinicaDL's inputs as its users have them: CAPS paths, TSVs, split folders, and ADNI's identifiers.

Most ADNI deep-learning work goes through Clinica and ClinicaDL (Wen et al. 2020): ``clinica
convert adni-to-bids``, ``clinica run t1-linear`` (affine registration to MNI152NLin2009cSym, 1 mm,
cropped to 169 x 208 x 179 voxels), ``clinicadl prepare-data`` (the images as ``.pt`` tensors) and
``clinicadl tsvtools get-labels / split / kfold`` (TSVs with ``participant_id``, ``session_id``,
``diagnosis``; split folders). This module reads those files as ClinicaDL writes them:

* :func:`subject_key` and :func:`session_id`: ADNI's three spellings of a subject (PTID
  ``002_S_0295``, BIDS ``sub-ADNI002S0295``, RID ``295``) name one subject; ``ses-M00`` (Clinica
  before 0.7.4) and ``ses-M000`` one session.
* :func:`t1_linear_image`: the t1-linear image of a session in a CAPS folder (cropped or not, both
  file-name generations), or ClinicaDL's extracted tensor of it.
* which TSVs of a split folder hold the train, validation and test sessions: the module beside this one,
  :mod:`~lightning_hybrid.data.clinicadl_splits`.
* :func:`read_tsv`: a TSV's sessions, diagnoses from a labels TSV where the split has none (2.0).
* :func:`label_code`: ClinicaDL's class order (labels sorted as strings: AD 0, CN 1; pMCI 0, sMCI 1).

Plain Python and nibabel; nothing here knows Lightning.
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: The MNI152NLin2009cSym grid of t1-linear (193 x 229 x 193 voxels of 1 mm) and the box Clinica crops
#: it to (169 x 208 x 179: ``MNI_CROP_BBOX`` in Clinica's ``crop_nifti``).
MNI152NLIN2009CSYM_SHAPE = (193, 229, 193)
MNI152NLIN2009CSYM_ORIGIN = (-96.0, -132.0, -78.0)
CROP_BOX = ((12, 181), (13, 221), (0, 179))
CROPPED_SHAPE = tuple(stop - start for start, stop in CROP_BOX)

#: ``clinicadl`` finds the t1-linear image with this glob in ``subjects/<sub>/<ses>/t1_linear/``
#: (it matches the older ``..._T1w_space-...`` names too).
T1_LINEAR_GLOB = {True: "*space-MNI152NLin2009cSym_desc-Crop_res-1x1x1_T1w.nii.gz",
                  False: "*space-MNI152NLin2009cSym_res-1x1x1_T1w.nii.gz"}

#: Diagnosis spellings (lower case) to ClinicaDL's labels.
DIAGNOSES = {
    "ad": "AD", "dementia": "AD", "alzheimer's disease": "AD",
    "cn": "CN", "nc": "CN", "normal": "CN", "control": "CN",
    "smci": "sMCI", "stable mci": "sMCI", "pmci": "pMCI", "progressive mci": "pMCI",
    "mci": "MCI", "emci": "MCI", "lmci": "MCI",
}
#: Real diagnoses no task here trains on: ADNI's significant memory concern, ClinicaDL getlabels' unstable
#: and reverting MCI, and frontotemporal dementia's behavioural variant. Their rows are read, then dropped
#: (and counted in the log) like any diagnosis outside a task's ``diagnoses``, as ClinicaDL drops them.
OTHER_DIAGNOSES = {"smc": "SMC", "significant memory concern": "SMC", "umci": "uMCI", "rmci": "rMCI", "bv": "BV"}

#: From healthy to demented: the later of two labels is the disease ("positive") class; the labels a task can compare.
SEVERITY = ("CN", "sMCI", "MCI", "pMCI", "AD")

_ADNI = re.compile(r"^(?:sub-)?(?:ADNI)?(\d{3})_?S_?(\d{4})$", re.IGNORECASE)
_SESSION = re.compile(r"^(?:ses-)?M(\d+)$", re.IGNORECASE)
_NUMBERED = re.compile(r"^(?:ses-)?M?(\d+)$", re.IGNORECASE)


class ClinicaDLFormatError(ValueError):
    """A TSV, split folder or CAPS file that is not as ClinicaDL writes it; the message names it."""


def subject_key(participant: str) -> str:
    """One key per subject whatever the spelling: ADNI's PTID ``002_S_0295``, BIDS ``sub-ADNI002S0295``
    and RID ``295`` all give ``"ADNI RID 295"`` (the RID is unique across ADNI's sites); other IDs
    lose a ``sub-`` prefix.

        >>> {subject_key(s) for s in ("002_S_0295", "sub-ADNI002S0295", "295", "0295")}
        {'ADNI RID 295'}
        >>> subject_key("sub-OAS30001")
        'OAS30001'
    """
    text = str(participant).strip()
    if match := _ADNI.match(text):
        return f"ADNI RID {int(match.group(2))}"
    if text.isdigit():
        return f"ADNI RID {int(text)}"
    return text.removeprefix("sub-")


def bids_participant(participant: str) -> str:
    """The BIDS ``participant_id`` Clinica's ADNI converter writes: ``002_S_0295`` -> ``sub-ADNI002S0295``."""
    text = str(participant).strip()
    if (match := _ADNI.match(text)) is not None:
        return f"sub-ADNI{match.group(1)}S{match.group(2)}"
    return text if text.startswith("sub-") else f"sub-{text}"


def session_id(session: str) -> str:
    """ClinicaDL's session ID (three digits since Clinica 0.7.4): ``ses-M00``, ``M0``, ``bl`` -> ``ses-M000``.

        >>> [session_id(s) for s in ("ses-M00", "ses-M000", "bl", "m06", "ses-M12")]
        ['ses-M000', 'ses-M000', 'ses-M000', 'ses-M006', 'ses-M012']
    """
    text = str(session).strip()
    if text.lower() in ("bl", "sc", "m0", "ses-bl"):
        return "ses-M000"
    if match := _SESSION.match(text):
        return f"ses-M{int(match.group(1)):03d}"
    return text if text.startswith("ses-") else f"ses-{text}"


def session_month(session: str) -> int | float:
    """The session's month (``ses-M012`` -> 12; a bare visit number is its value), for ordering; other names sort last."""
    match = _NUMBERED.match(session_id(session))
    return int(match.group(1)) if match else float("inf")


def diagnosis_label(raw: str) -> str | None:
    """ClinicaDL's label for a diagnosis spelling (``NC``, ``Dementia`` -> ``CN``, ``AD``; ``SMC`` and the other
    :data:`OTHER_DIAGNOSES`, which no task compares), ``None`` if unknown."""
    text = str(raw).strip().lower()
    return DIAGNOSES.get(text) or OTHER_DIAGNOSES.get(text)


def label_code(diagnoses: Iterable[str]) -> dict[str, int]:
    """Class index of each label, as ClinicaDL's ``generate_label_code`` makes it (sorted as strings).

        >>> label_code(["CN", "AD"]), label_code(["sMCI", "pMCI"])
        ({'AD': 0, 'CN': 1}, {'pMCI': 0, 'sMCI': 1})
    """
    return {label: index for index, label in enumerate(sorted(set(diagnoses)))}


def disease_label(diagnoses: Sequence[str]) -> str:
    """The disease ("positive") label of a pair: the later stage of :data:`SEVERITY` (AD of AD/CN, pMCI of pMCI/sMCI)."""
    known = [d for d in diagnoses if d in SEVERITY]
    if len(known) != len(diagnoses):
        raise ValueError(f"unknown diagnoses {sorted(set(diagnoses) - set(known))}; known: {list(SEVERITY)}")
    return max(known, key=SEVERITY.index)


@dataclass(frozen=True)
class Row:
    """One session of a TSV: ``participant_id`` and ``session_id`` as written, the diagnosis, the TSV and line."""

    participant: str
    session: str
    diagnosis: str
    source: Path
    line: int

    @property
    def subject(self) -> str:
        return subject_key(self.participant)

    @property
    def key(self) -> tuple[str, str]:
        """(subject, session) with the spellings normalised: the same scan whatever the TSV wrote."""
        return self.subject, session_id(self.session)


class NoDiagnosisError(ClinicaDLFormatError):
    """A TSV without a diagnosis column and no labels TSV to take the diagnoses from (ClinicaDL 2.0's splits)."""


def read_tsv(path: Path, skipped: list[str] | None = None, labels: Mapping[tuple[str, str], Row] | None = None) -> list[Row]:
    """The sessions of a ClinicaDL TSV (tab-separated, with ``participant_id``, ``session_id`` and ``diagnosis``).

    A TSV without ``diagnosis`` (ClinicaDL 2.0's ``make_split`` and ``make_kfold`` write only the IDs and
    the stratification columns) takes each session's diagnosis from ``labels`` (:func:`read_labels` of
    the TSV the split was made from); a session missing there is refused naming both files.
    A diagnosis ClinicaDL does not know raises :class:`ClinicaDLFormatError` naming the line (or, with
    ``skipped`` given, is listed there and left out); labels are ClinicaDL's spellings (``NC`` and
    ``Dementia`` read as ``CN`` and ``AD``; ``SMC`` is kept as ``SMC`` for the caller to drop).
    """
    path = Path(path)
    if not path.is_file():
        raise ClinicaDLFormatError(f"{path}: no such TSV file")
    with open(path, newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in ("participant_id", "session_id") if c not in header]
        if missing:
            hint = " (is it comma-separated? pass it as csv_path)" if len(header) == 1 and "," in header[0] else ""
            raise ClinicaDLFormatError(
                f"{path}: no {', '.join(repr(c) for c in missing)} column{'s' if len(missing) > 1 else ''}; a ClinicaDL TSV "
                f"has participant_id, session_id and diagnosis, tab-separated (columns here: {header}){hint}"
            )
        if "diagnosis" not in header and labels is None:
            raise NoDiagnosisError(
                f"{path}: no 'diagnosis' column (columns here: {header}). ClinicaDL 2.0's make_split and make_kfold write "
                "only participant_id, session_id and the stratification columns: give the labels TSV the split was made "
                "from as data.source.labels_tsv=PATH (source={'labels_tsv': PATH} in Python), or put labels.tsv in a "
                "folder above the split, where clinicadl tsvtools looks for it"
            )
        rows = []
        for line, record in enumerate(reader, start=2):
            record = {k.strip(): (v or "").strip() for k, v in record.items() if k is not None}
            if "diagnosis" in header:
                label = diagnosis_label(record["diagnosis"])
                raw = record["diagnosis"]
            else:
                known = labels.get((subject_key(record["participant_id"]), session_id(record["session_id"])))
                if known is None:
                    raise ClinicaDLFormatError(
                        f"{path}, line {line}: {record['participant_id']} {record['session_id']} has no diagnosis in the "
                        f"labels TSV {next(iter(labels.values())).source if labels else '(empty)'}; was the split made "
                        "from another TSV?"
                    )
                label, raw = known.diagnosis, known.diagnosis
            if label is None:
                error = ClinicaDLFormatError(
                    f"{path}, line {line}: unknown diagnosis {raw!r} (known: AD, CN, MCI, sMCI, pMCI, their ADNI "
                    "spellings NC, Dementia, EMCI, LMCI, and SMC, uMCI, rMCI, BV, which no task compares)"
                )
                if skipped is None:
                    raise error
                skipped.append(str(error))
                continue
            rows.append(Row(record["participant_id"], record["session_id"], label, path, line))
    return rows


def read_labels(path: Path) -> dict[tuple[str, str], Row]:
    """A labels TSV (``participant_id``, ``session_id``, ``diagnosis``: ``tsvtools get-labels``' output) by scan."""
    return {row.key: row for row in read_tsv(path)}


def find_labels_tsv(split_folder: Path, levels: int = 4) -> Path | None:
    """``labels.tsv`` in ``split_folder`` or up to ``levels`` folders above it, where ``clinicadl tsvtools split``
    and ``kfold`` look for the diagnoses a split TSV lacks; ``None`` if there is none."""
    folder = Path(split_folder).resolve()
    for candidate in [folder, *folder.parents][: levels + 1]:
        if (candidate / "labels.tsv").is_file():
            return candidate / "labels.tsv"
    return None


def write_tsv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """A tab-separated file with ``columns``, as ClinicaDL's ``tsvtools`` write them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), delimiter="\t", extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def baseline_rows(rows: Sequence[Row]) -> list[Row]:
    """Each subject's first session (ClinicaDL's ``baseline``: the session closest to ``ses-M000``)."""
    first: dict[str, Row] = {}
    for row in rows:
        if row.subject not in first or session_month(row.session) < session_month(first[row.subject].session):
            first[row.subject] = row
    return [row for row in rows if first[row.subject] is row]


def _session_folders(session: str) -> list[str]:
    """A session's folder names to try: as written, Clinica's three digits (``ses-M000``) and its older two (``ses-M00``)."""
    canonical = session_id(session)
    month = session_month(canonical)
    older = f"ses-M{month:02d}" if isinstance(month, int) and canonical.startswith("ses-M") else canonical
    return list(dict.fromkeys((session, canonical, older)))


def _participant_folders(caps_directory: Path, participant: str) -> list[str]:
    """A participant's folder names to try: as written, in BIDS form, and for a bare ADNI RID the
    ``sub-ADNI<site>S<rid>`` folders of any site (the RID is unique across sites)."""
    names = [participant, bids_participant(participant)]
    key = subject_key(participant)
    if key.startswith("ADNI RID ") and str(participant).strip().isdigit():
        rid = int(key.removeprefix("ADNI RID "))
        names += sorted(p.name for p in (caps_directory / "subjects").glob(f"sub-ADNI[0-9][0-9][0-9]S{rid:04d}"))
    return list(dict.fromkeys(names))


def _found(folder: Path, pattern: str) -> list[Path]:
    """Files under ``folder`` (at any depth) that match ``pattern`` whatever its letters' case: ClinicaDL's
    search (``subjects/<sub>/<ses>/**/<pattern>``, its ``insensitive_glob``)."""
    insensitive = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in pattern)
    return sorted(folder.glob(f"**/{insensitive}"))


_RUN = re.compile(r"_run-(\d+)")


def _one_image(found: list[Path]) -> Path | None:
    """The one image of ``found``; of several runs of one scan (names equal but for ``_run-<n>``) the latest, as
    Clinica picks it, with a warning; several other images are refused, naming them."""
    if len(found) <= 1:
        return found[0] if found else None
    unrun = {(p.parent, _RUN.sub("", p.name)) for p in found}
    if len(unrun) == 1 and all(_RUN.search(p.name) for p in found):
        latest = max(found, key=lambda p: int(_RUN.search(p.name).group(1)))
        log.warning("%d runs of one scan in %s; using the latest, %s (as ClinicaDL does)", len(found), latest.parent, latest.name)
        return latest
    raise ClinicaDLFormatError(f"{len(found)} t1-linear images match for one session; expected one: {[str(p) for p in found]}")


def t1_linear_image(caps_directory: Path, participant: str, session: str, cropped: bool = True) -> Path:
    """The t1-linear image of a session in a CAPS folder: ClinicaDL's extracted ``.pt`` tensor where
    ``clinicadl prepare-data`` wrote one, else the NIfTI. The participant's folder is tried as the TSV
    writes it, in BIDS form and (a bare RID) as any site's ``sub-ADNI...`` folder; the session's as
    written and in both of Clinica's spellings. The image is looked for at any depth of the session's
    folder, letters in any case, as ClinicaDL looks for it.
    """
    caps_directory = Path(caps_directory)
    image_glob = T1_LINEAR_GLOB[cropped]
    tensor_glob = image_glob.replace(".nii.gz", ".pt")
    folders = [caps_directory / "subjects" / p / s
               for p in _participant_folders(caps_directory, participant) for s in _session_folders(session)]
    for folder in folders:
        if not folder.is_dir():
            continue
        tensors = folder / "deeplearning_prepare_data" / "image_based"
        image = _one_image(_found(folder, image_glob)) or _one_image(_found(tensors, tensor_glob))
        if image is not None:
            tensor = tensors / "t1_linear" / image.name.replace(".nii.gz", ".pt")
            return tensor if tensor.is_file() else image
    shown = next((f for f in folders if f.is_dir()), folders[0]) / "t1_linear" / image_glob
    raise ClinicaDLFormatError(
        f"{participant} {session}: no t1-linear image (looked for {shown} and {len(folders) - 1} other spellings of the "
        f"folder; has t1-linear run for this session{', and is use_uncropped_image=true what you mean' if not cropped else ''}?)"
    )


def t1_linear_affine(cropped: bool = True) -> np.ndarray:
    """The voxel-to-world affine of a t1-linear image (RAS, 1 mm), for a ``.pt`` tensor without its NIfTI."""
    affine = np.eye(4)
    affine[:3, 3] = MNI152NLIN2009CSYM_ORIGIN
    if cropped:
        affine[:3, 3] += [start for start, _ in CROP_BOX]
    return affine
