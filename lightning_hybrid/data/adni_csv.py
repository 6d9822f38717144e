"""A cohort listed in a CSV (a subject, an image path, a diagnosis and optionally a session per row, ADNI's usual
column names and diagnosis spellings): the rows :class:`~lightning_hybrid.data.ADNIDataModule` reads beside
ClinicaDL's TSVs. Plain Python."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from lightning_hybrid.data import clinicadl
from lightning_hybrid.data.clinicadl import Row
from lightning_hybrid.data.volume_files import BadItemError

#: Column names a CSV may use for each field (case-insensitive): ADNI's usual spellings.
COLUMNS = {
    "subject_id": ("subject_id", "participant_id", "subject", "ptid", "rid", "subject id"),
    "image": ("image", "path", "file", "filename", "image_path", "image path"),
    "diagnosis": ("diagnosis", "dx", "dx_bl", "group", "research group", "label"),
}
#: Optional CSV column of the session (visit): baseline evaluation needs it.
SESSION_COLUMNS = ("session_id", "session", "viscode", "visit")


def _column(header: Sequence[str], aliases: Sequence[str]) -> str | None:
    """The header's name of the first of ``aliases`` it has (case-insensitive), or None."""
    lowered = {h.strip().lower(): h for h in header}
    return next((lowered[alias] for alias in aliases if alias in lowered), None)


def read_csv_rows(csv_path: Path, root: Path | None, skipped: list[str] | None = None) -> list[tuple[Row, Path]]:
    """The rows of a comma-separated cohort table with a subject, an image path (relative to the CSV's
    folder or ``root``, or absolute), a diagnosis and optionally a session column: ADNI's usual names.
    A row with an unknown diagnosis raises BadItemError, or is listed in ``skipped`` when that is given."""
    rows = []
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        columns = {field: _column(header, aliases) for field, aliases in COLUMNS.items()}
        for field, name in columns.items():
            if name is None:
                hint = " (a ClinicaDL TSV? pass caps_directory and tsv_path)" if "\t" in ",".join(header) else ""
                raise BadItemError(f"{csv_path}: no {field!r} column (accepted names: {', '.join(COLUMNS[field])}); "
                                   f"columns are {list(header)}{hint}")
        session_column = _column(header, SESSION_COLUMNS)
        for line, record in enumerate(reader, start=2):  # line 1 is the header
            label = clinicadl.diagnosis_label(record[columns["diagnosis"]] or "")
            if label is None:
                error = BadItemError(
                    f"{csv_path}, line {line}: unknown diagnosis {(record[columns['diagnosis']] or '').strip()!r} "
                    "(known: AD, CN/NC, sMCI, pMCI, MCI and ADNI's spellings)"
                )
                if skipped is None:
                    raise error
                skipped.append(str(error))
                continue
            image = Path(record[columns["image"]].strip())
            if not image.is_absolute():
                image = (root or csv_path.parent) / image
            session = (record[session_column] or "").strip() if session_column else ""
            rows.append((Row(record[columns["subject_id"]].strip(), session, label, csv_path, line), image))
    return rows
