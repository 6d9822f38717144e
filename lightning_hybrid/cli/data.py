"""`lightning-hybrid data ...`: the subcommands that write data sets (make-adni-like, make-adni-phantoms, pack, augment-mnist)."""

from __future__ import annotations

import logging

log = logging.getLogger("lightning_hybrid")


def data_command(argv: list[str]) -> None:
    """``lightning-hybrid data make-adni-like OUT --subjects N``: an ADNI-like cohort from real anatomy in
    ClinicaDL's layout (CAPS, TSVs, split folders; :mod:`lightning_hybrid.data.adni_like`);
    ``lightning-hybrid data make-adni-phantoms --out DIR --subjects N``: synthetic geometric volumes and a CSV;
    ``lightning-hybrid data pack --root MNIST_DIR --out STORE``: MNIST as a shard store;
    ``lightning-hybrid data augment-mnist --root MNIST_DIR --out STORE --samples N``: MNIST's training
    digits expanded with elastic and affine distortions to N samples, as a shard store (cNeural)."""
    import argparse

    from lightning_hybrid.data.adni_phantoms import write_adni_phantoms
    from lightning_hybrid.deprecation import warn_renamed

    parser = argparse.ArgumentParser(prog="lightning-hybrid data", description="Write data sets.")
    commands = parser.add_subparsers(dest="command", required=True)
    like = commands.add_parser("make-adni-like", help="an ADNI-like cohort from real anatomy (Colin27, AAL) in "
                               "ClinicaDL's layout: CAPS t1-linear images, atrophy masks, TSVs, split folders")
    like.add_argument("out", help="folder to write caps/, labels.tsv, split/ and truth.tsv into")
    like.add_argument("--subjects", type=int, default=300, help="subjects in all, split evenly over the diagnoses")
    like.add_argument("--diagnoses", nargs="+", default=["AD", "CN"], help="e.g. AD CN, or pMCI sMCI, or AD CN sMCI pMCI")
    like.add_argument("--seed", type=int, default=0)
    like.add_argument("--hippocampus-mm", type=float, default=None, help="hippocampal boundary moved inwards at severity 1")
    like.add_argument("--ventricles-mm", type=float, default=None, help="ventricular boundary moved outwards at severity 1")
    like.add_argument("--followup-fraction", type=float, default=None, help="share of subjects with a 12-month session")
    like.add_argument("--templates", default=None, help="folder with ch2.nii.gz, ch2bet.nii.gz, aal.nii.gz "
                      "(default: Debian's mricron-data, /usr/share/mricron/templates)")
    like.add_argument("--workers", type=int, default=None, help="processes (default: the machine's cores)")
    synth = commands.add_parser("make-adni-phantoms", aliases=["synth-adni"], help="ellipsoid phantoms in ADNI's CSV layout "
                                "(NIfTI volumes and their CSV; not anatomy: make-adni-like is)")
    synth.add_argument("--out", required=True, help="folder to write images/ and adni.csv into")
    synth.add_argument("--subjects", type=int, default=40)
    synth.add_argument("--shape", type=int, nargs=3, default=(64, 76, 64), metavar=("D", "H", "W"))
    synth.add_argument("--seed", type=int, default=0)
    pack = commands.add_parser("pack", help="MNIST's IDX files as a shard store (a folder or an fsspec URL)")
    pack.add_argument("--root", required=True, help="folder with MNIST's four .gz files")
    pack.add_argument("--out", required=True, help="store folder or URL (s3://..., hdfs://..., memory://...)")
    pack.add_argument("--split", choices=("train", "test"), default="train")
    pack.add_argument("--shard-size", type=int, default=10000, help="samples per shard")
    augment = commands.add_parser("augment-mnist", help="MNIST's training digits expanded with elastic and affine "
                                  "distortions, as a shard store (cNeural's 0.5M-2M samples)")
    augment.add_argument("--root", required=True, help="folder with MNIST's four .gz files")
    augment.add_argument("--out", required=True, help="store folder or URL (s3://..., hdfs://..., memory://...)")
    augment.add_argument("--samples", type=int, default=500_000, help="samples to write in all (default 500000)")
    augment.add_argument("--shard-size", type=int, default=50_000, help="samples per shard (default 50000)")
    augment.add_argument("--seed", type=int, default=0, help="seed of the order and of every distortion")
    augment.add_argument("--include-originals", action=argparse.BooleanOptionalAction, default=True,
                         help="write the 60,000 undistorted digits first (default: yes)")
    for command in (pack, augment):
        command.add_argument("--no-verify-md5", dest="verify_md5", action="store_false",
                             help="skip the md5 check of the files (for other data sets in MNIST's format)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "synth-adni":
        warn_renamed("lightning-hybrid data synth-adni", "lightning-hybrid data make-adni-phantoms", stacklevel=2)

    def read_mnist(split: str):
        from lightning_hybrid.data.idx import read_idx
        from lightning_hybrid.data.mnist import MNIST_FILES, find_mnist_folder

        folder = find_mnist_folder(args.root)
        if folder is None:
            raise SystemExit(f"{args.root} does not hold MNIST's four files ({', '.join(MNIST_FILES)})")
        prefix = "train" if split == "train" else "t10k"
        return tuple(read_idx(folder / n, MNIST_FILES[n] if args.verify_md5 else None)
                     for n in (f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"))

    if args.command == "pack":
        from lightning_hybrid.data.shards import pack as pack_store

        images, labels = read_mnist(args.split)
        store = pack_store(images[:, None], labels.astype("int64"), args.out, args.shard_size)
        log.info("%d samples in %d shards: %s", store.num_samples, store.num_shards, args.out)
        return
    if args.command == "augment-mnist":
        import time

        from lightning_hybrid.data.digit_distortion import augment_mnist

        if args.samples < 1 or args.shard_size < 1:
            raise SystemExit(f"--samples and --shard-size must be >= 1, got {args.samples} and {args.shard_size}")
        images, labels = read_mnist("train")
        start = time.perf_counter()
        store = augment_mnist(images, labels, args.samples, args.out, shard_size=args.shard_size, seed=args.seed,
                              include_originals=args.include_originals)
        elapsed = time.perf_counter() - start
        log.info("%d samples in %d shards in %.1f s (%.0f samples/s): %s", store.num_samples, store.num_shards,
                 elapsed, store.num_samples / max(elapsed, 1e-9), args.out)
        return
    if args.command == "make-adni-like":
        from dataclasses import replace

        from lightning_hybrid.data.adni_like import MRICRON_TEMPLATES, CohortSettings, TemplateNotFoundError, write_cohort

        if args.subjects < len(args.diagnoses):
            raise SystemExit(f"--subjects {args.subjects}: at least one per diagnosis ({len(args.diagnoses)}) is needed")
        counts = {d: args.subjects // len(args.diagnoses) + (i < args.subjects % len(args.diagnoses))
                  for i, d in enumerate(args.diagnoses)}
        chosen = {"hippocampus_mm": args.hippocampus_mm, "ventricles_mm": args.ventricles_mm,
                  "followup_fraction": args.followup_fraction}
        settings = replace(CohortSettings(subjects=counts, seed=args.seed), **{k: v for k, v in chosen.items() if v is not None})
        try:
            out = write_cohort(args.out, settings, args.templates or MRICRON_TEMPLATES, workers=args.workers)
        except (TemplateNotFoundError, ValueError) as err:
            raise SystemExit(str(err)) from None
        log.info("CAPS: %s/caps; TSVs: %s/labels.tsv and %s/split (train with data=adni_caps data.source.caps_directory=%s/caps "
                 "data.source.tsv_path=%s/split data.split.fold=0)", out, out, out, out, out)
        return
    csv_path = write_adni_phantoms(args.out, subjects=args.subjects, shape=tuple(args.shape), seed=args.seed)
    log.info("CSV: %s", csv_path)
