"""ADNIDataModule's settings in groups (lightning_hybrid.data.adni_settings): each checks its values naming the
key a user types, is made from a Hydra group, and an older run's flat config reads as the grouped one."""

from __future__ import annotations

import inspect
from dataclasses import asdict

import pytest
from omegaconf import OmegaConf

from lightning_hybrid.data import ADNIDataModule
from lightning_hybrid.data.adni_settings import Augment, Cache, Source, Split, View, group_flat_arguments, settings

# data=adni_caps as its config was before the grouping (resolved values of a run's .hydra/config.yaml)
FLAT_ADNI_CAPS = {
    "_target_": "lightning_hybrid.data.ADNIDataModule", "csv_path": None, "root": None, "task": "pMCI_vs_sMCI",
    "diagnoses": None, "image_shape": [80, 104, 88], "batch_size": 6, "seed": 1, "on_bad_file": "error",
    "val_fraction": 0.15, "test_fraction": 0.15, "folds": None, "fold": 0, "spacing": [2.0, 2.0, 2.0], "downsample": 1,
    "augment": True, "augment_on": "device", "cache": "auto", "cache_dir": "data/cache/adni_like", "num_workers": "auto",
    "pin_memory": "auto", "prefetch_factor": 4, "preprocess_threads": 4, "skip_leak_check": False,
    "caps_directory": "data/adni_like/caps", "tsv_path": "data/adni_like/split", "split": 3, "labels_tsv": None,
    "baseline": False, "valid_longitudinal": True, "use_uncropped_image": False,
}


def test_each_group_checks_its_values_naming_the_key_to_set():
    assert View(image_shape=[64, 64, 64], spacing=2).spacing == (2.0, 2.0, 2.0)
    assert View(image_shape=(64, 64, 64), downsample=2).shape == (32, 32, 32)
    with pytest.raises(ValueError, match=r"view.image_shape must be 3 sizes divisible by view.downsample=3"):
        View(image_shape=(64, 64, 64), downsample=3)
    with pytest.raises(ValueError, match="give either source.csv_path .* or source.caps_directory"):
        Source()
    with pytest.raises(ValueError, match="source.caps_directory needs source.tsv_path"):
        Source(caps_directory="caps")
    with pytest.raises(ValueError, match=r"split.fold must be in \[0, 5\)"):
        Split(fold=5, folds=5)
    with pytest.raises(ValueError, match="cache.where=disk needs a cache.dir"):
        Cache(where="disk")
    with pytest.raises(ValueError, match="augment.where must be one of"):
        Augment(where="gpu")
    assert Augment(where=False).where is None and Augment(where=True).where == "device"


def test_a_group_is_made_from_a_mapping_and_unknown_keys_are_refused_naming_the_known():
    hydra_group = OmegaConf.create({"image_shape": [32, 32, 32], "spacing": [3, 3, 3]})
    assert settings(View, hydra_group) == View(image_shape=(32, 32, 32), spacing=(3.0, 3.0, 3.0))
    assert settings(View, View(downsample=2)).downsample == 2
    with pytest.raises(TypeError, match="view has no 'spacings'; its settings are image_shape, spacing, downsample"):
        settings(View, {"spacings": 2})


def test_none_is_off_where_a_group_can_be_off_and_refused_elsewhere():
    """cache=None and augment=None (Hydra's null too) mean nothing cached and no augmentation, as before the
    grouping; a view or split cannot be off: None there is refused, saying what to give."""
    assert settings(Cache, None).where is None and settings(Augment, None).where is None
    assert settings(Cache, OmegaConf.create({"where": None})).where is None
    for group, name in ((View, "view"), (Split, "split"), (Source, "source")):
        with pytest.raises(TypeError, match=rf"{name}=None: {name} cannot be off; leave it out for its defaults"):
            settings(group, None)


def test_python_users_of_the_flat_settings_are_told_where_each_went(tmp_path):
    """The keywords of ADNIDataModule before its settings were grouped are answered as the command line
    answers them; a value where a group goes says how to write it; a key in the wrong group names its group."""
    from lightning_hybrid.data import ADNIDataModule

    source = {"csv_path": tmp_path / "missing.csv"}
    with pytest.raises(TypeError, match=r"settings are in groups now:\ncaps_directory='c' -> source=\{'caps_directory': 'c'\}"
                       r"\nimage_shape=\[8, 8, 8\] -> view=\{'image_shape': \[8, 8, 8\]\}\ncache_dir='d' -> cache=\{'dir': 'd'\}"
                       r"\nbaseline=True -> split=\{'baseline': True\}"):
        ADNIDataModule(source, caps_directory="c", image_shape=[8, 8, 8], cache_dir="d", baseline=True)
    # as an old script wrote it, without the source the grouped datamodule requires
    with pytest.raises(TypeError, match=r"settings are in groups now:\ncaps_directory='c' -> source=\{'caps_directory': 'c'\}"
                       r"\ntsv_path='t' -> source=\{'tsv_path': 't'\}"):
        ADNIDataModule(caps_directory="c", tsv_path="t")
    with pytest.raises(TypeError, match=r"ADNIDataModule needs source=: Source\(caps_directory=\.\.\., tsv_path=\.\.\.\)"):
        ADNIDataModule()
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'colour'"):
        ADNIDataModule(source, colour="blue")
    with pytest.raises(TypeError, match=r"split must be a Split or a mapping of its fields, e.g. split=\{'fold': 3\}, got 3"):
        settings(Split, 3)
    with pytest.raises(TypeError, match=r"split has no 'caps_directory': 'caps_directory' belongs to source "
                       r"\(source=\{'caps_directory': ...\}\)"):
        settings(Split, {"caps_directory": "c"})
    with pytest.raises(TypeError, match=r"augment must be an Augment or a mapping"):
        settings(Augment, "device")


def test_both_augmentation_paths_draw_from_the_groups_probabilities():
    augment = Augment(flip_prob=1.0, affine_prob=0.0, noise_prob=0.0)
    assert augment.batched(seed=0).flip_prob == 1.0 and augment.batched(seed=0).affine_prob == 0.0
    assert [transform.prob for transform in augment.per_sample().transforms] == [1.0, 0.0, 0.0]


def test_an_older_runs_flat_config_reads_as_the_grouped_one():
    grouped = group_flat_arguments(FLAT_ADNI_CAPS)
    assert settings(Source, grouped["source"]) == Source(caps_directory="data/adni_like/caps",
                                                       tsv_path="data/adni_like/split")
    assert settings(Split, grouped["split"]) == Split(fold=3, valid_longitudinal=True)  # ClinicaDL's split, not fold
    assert settings(View, grouped["view"]) == View(image_shape=(80, 104, 88), spacing=(2.0, 2.0, 2.0))
    assert settings(Augment, grouped["augment"]) == Augment(where="device")
    assert asdict(settings(Cache, grouped["cache"])) == {"where": "auto", "dir": "data/cache/adni_like", "threads": 4}
    assert {k: grouped[k] for k in ("task", "batch_size", "num_workers")} == {
        "task": "pMCI_vs_sMCI", "batch_size": 6, "num_workers": "auto"}
    arguments = set(inspect.signature(ADNIDataModule.__init__).parameters)
    assert set(grouped) - {"_target_"} <= arguments, set(grouped) - arguments  # instantiable: nothing left over
    csv = group_flat_arguments({**FLAT_ADNI_CAPS, "caps_directory": None, "tsv_path": None, "csv_path": "a.csv", "folds": 5,
                   "fold": 2, "augment": False})
    assert csv["source"] == {"csv_path": "a.csv", "root": None, "on_bad_file": "error", "use_uncropped_image": False}
    assert csv["split"]["fold"] == 2 and csv["split"]["folds"] == 5 and csv["augment"] == {"where": None}
    synthetic = group_flat_arguments({"_target_": "lightning_hybrid.data.PhantomADNIDataModule", "csv_path": None,
                         "root": "data/adni_phantoms", "subjects": 40, "image_shape": [64, 64, 64]})
    assert synthetic["root"] == "data/adni_phantoms" and "source" not in synthetic  # its own folder, not the CSV's
    assert group_flat_arguments(grouped) == grouped  # grouped already: kept


def test_explain_reads_a_run_folder_written_before_the_grouping(tmp_path):
    from lightning_hybrid.explain import run_config

    (tmp_path / ".hydra").mkdir()
    OmegaConf.save({"paths": {"root_dir": ".", "output_dir": "."}, "data": FLAT_ADNI_CAPS}, tmp_path / ".hydra" / "config.yaml")
    data = run_config(tmp_path).data
    assert data.source.caps_directory == "data/adni_like/caps" and data.split.fold == 3
    assert list(data.view.image_shape) == [80, 104, 88] and data.cache.where is None and data.cache.dir is None
    assert "image_shape" not in data and "caps_directory" not in data
