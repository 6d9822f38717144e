"""Both Lightning namespaces (``lightning_hybrid.namespace``): the glue served against ``lightning`` as
well as ``pytorch_lightning``, each alias building its own namespace's strategy, and real 2-process
fits of a user's module in each namespace, with the other one installed or not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning
import lightning.pytorch
import pytest
import pytorch_lightning
import torch

import lightning_hybrid
import lightning_hybrid.lightning  # noqa: F401  (how aliases reach L.Trainer whatever was imported first: docs/python.md)
from conftest import SUPPORT, clean_env
from lightning_hybrid import namespace
from suite_configs import suite_aliases

TESTS = Path(__file__).parent


def test_the_modules_that_import_lightning_are_glue_and_the_others_are_shared():
    glue = namespace.glue_modules()
    assert {"lightning_hybrid", "lightning_hybrid.strategies.ssp", "lightning_hybrid.straggler"} <= glue
    assert "lightning_hybrid.strategies.step_count" in glue  # it imports pytorch_lightning
    # under a package that imports its exports on first use (PEP 562), a plain module is shared
    assert not {"lightning_hybrid.data.idx", "lightning_hybrid.data.adni_settings", "lightning_hybrid.cli.resume",
                "lightning_hybrid.strategies.capabilities", "lightning_hybrid.strategies.rank_exit_watch"} & glue
    assert {"lightning_hybrid.data", "lightning_hybrid.cli", "lightning_hybrid.strategies"} <= glue  # they export glue
    assert not {"lightning_hybrid.comm.delayed_allreduce", "lightning_hybrid.run_folder", "lightning_hybrid.namespace",
                "lightning_hybrid.transfer"} & glue  # `from lightning_hybrid import run_folder` is not glue
    import lightning_hybrid.comm
    import lightning_hybrid.lightning.comm
    import lightning_hybrid.lightning.pipeline.materialize as mirrored
    import lightning_hybrid.pipeline.materialize

    assert lightning_hybrid.lightning.comm.DelayedAllReduce is lightning_hybrid.comm.DelayedAllReduce, "an algorithm's objects are one"
    assert mirrored._own_tensors is lightning_hybrid.pipeline.materialize._own_tensors  # private names too


def test_what_is_not_lightning_glue_is_one_object_under_both_names(tmp_path):
    """One class per concept: every public class, function and exception of a module that is not glue is the
    same object under ``lightning_hybrid.lightning``; an exception raised under one name is caught under the
    other; a ``View`` made under either name is taken by either namespace's ``ADNIDataModule``."""
    import importlib

    glue, checked = namespace.glue_modules(), 0
    for path in namespace._generated_sources():
        name = namespace._module_name(path)
        if name in glue or name == namespace.PACKAGE:
            continue
        plain = importlib.import_module(name)
        mirrored = importlib.import_module(namespace.MIRROR + name[len(namespace.PACKAGE):])
        for attr in getattr(plain, "__all__", [a for a in vars(plain) if not a.startswith("_")]):
            obj = getattr(plain, attr)
            if isinstance(obj, type) or callable(obj):
                assert getattr(mirrored, attr) is obj, f"{name}.{attr} is two objects"
                checked += 1
    assert checked > 100, checked

    import lightning_hybrid.data as ours
    import lightning_hybrid.lightning.data as theirs
    from lightning_hybrid.data.adni_settings import View
    from lightning_hybrid.lightning.data.adni_settings import View as TheirView

    with pytest.raises(ours.DataFileError):
        raise theirs.DataFileError("raised under lightning_hybrid.lightning, caught under lightning_hybrid")
    for datamodule in (ours.ADNIDataModule, theirs.ADNIDataModule):
        for view in (View(image_shape=(32, 32, 32)), TheirView(image_shape=(32, 32, 32))):
            (tmp_path / "adni.csv").write_text("subject,session,label,path\n")
            assert datamodule({"csv_path": tmp_path / "adni.csv"}, view=view).view == view
    assert theirs.ADNIDataModule is not ours.ADNIDataModule  # Lightning glue: one per namespace


def test_the_lightning_flavour_is_real_files_generated_and_current():
    """``lightning_hybrid/lightning/`` is what ``python tools/generate_lightning_namespace.py`` writes, and no import
    hook remains: a stale or missing file fails here, naming the command that rewrites it. A glue module's file is
    its source translated to ``lightning``: a module as any other (its code object's file is the mirror's, its
    source and docstrings there for ``inspect``, IDEs and ``.pyc`` caches), marked as generated."""
    import inspect

    stale = namespace.stale_mirror_files()
    assert not stale, f"stale lightning flavour files {stale}: run `python tools/generate_lightning_namespace.py` and commit them"
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("lightning_hybrid")], sys.meta_path
    import lightning_hybrid.lightning.strategies.ssp as ssp
    import lightning_hybrid.strategies.ssp as plain_ssp

    assert Path(ssp.__file__) == namespace.MIRROR_DIR / "strategies" / "ssp.py"
    assert issubclass(ssp.SSPStrategy, lightning.pytorch.strategies.Strategy) and ssp.SSPStrategy.__module__ == ssp.__name__
    assert ssp.SSPStrategy.__init__.__code__.co_filename == ssp.__file__
    for flavour in (ssp, plain_ssp):  # hover help and "go to definition" under both names
        source = inspect.getsource(flavour.SSPStrategy)
        assert source.startswith("class SSPStrategy(") and flavour.SSPStrategy.__doc__ in source
        assert ("lightning.pytorch" in inspect.getsource(flavour)) == (flavour is ssp)
    assert not list(namespace.MIRROR_DIR.rglob("*.pyi")), "the real files carry the interface: no stubs"
    assert all(p.read_text().startswith("# Generated from lightning_hybrid/") for p in namespace.MIRROR_DIR.rglob("*.py"))


def test_a_glue_module_defines_no_plain_class_and_every_plain_class_is_one_object():
    """A class that names no Lightning lives in a plain module (:func:`lightning_hybrid.namespace.plain_classes_in_glue`
    finds none in glue), so that it is one object under both names: an exception raised under one name is
    caught under the other (``MNISTNotFoundError`` was two, and the ``lightning`` datamodule's was not caught
    by an ``except`` of the other's)."""
    assert namespace.plain_classes_in_glue() == []
    import lightning_hybrid.data as ours
    import lightning_hybrid.lightning.data as theirs

    assert theirs.MNISTNotFoundError is ours.MNISTNotFoundError
    with pytest.raises(ours.MNISTNotFoundError):
        theirs.MNISTDataModule(root="/nonexistent/mnist", download=False).prepare_data()


def test_the_lightning_source_names_lightning_and_the_mirror_s_glue():
    source = ("import pytorch_lightning as pl\nfrom lightning_fabric.utilities import seed\n"
              "from lightning_hybrid.strategies.checked_ddp import CheckedDDPStrategy\n"
              "from lightning_hybrid.comm import DelayedAllReduce\nfrom lightning_hybrid import ClassifierModule\n")
    assert namespace.lightning_source(source, mirrored=True).splitlines() == [
        "import lightning.pytorch as pl", "from lightning.fabric.utilities import seed",
        "from lightning_hybrid.lightning.strategies.checked_ddp import CheckedDDPStrategy",
        "from lightning_hybrid.comm import DelayedAllReduce", "from lightning_hybrid.lightning import ClassifierModule"]
    assert "from lightning_hybrid.strategies.checked_ddp" in namespace.lightning_source(source, mirrored=False)


@pytest.mark.parametrize("alias", sorted(suite_aliases()))
def test_every_alias_builds_the_strategy_of_the_trainer_s_namespace(alias):
    cls, params = suite_aliases()[alias]
    for trainer_cls, base, flavour in ((lightning.Trainer, lightning.pytorch.strategies.Strategy, "lightning_hybrid.lightning."),
                                       (pytorch_lightning.Trainer, pytorch_lightning.strategies.Strategy, "lightning_hybrid.strategies.")):
        strategy = trainer_cls(accelerator="cpu", devices=2, strategy=alias, logger=False).strategy
        assert isinstance(strategy, base) and type(strategy).__module__.startswith(flavour), type(strategy)
        assert type(strategy).__qualname__ == cls.__qualname__
        assert all(getattr(strategy, key, value) == value for key, value in params.items()), params


def test_a_lightning_flavour_object_is_refused_by_the_other_trainer_with_lightning_s_message():
    from lightning_hybrid.lightning import SSPStrategy

    with pytest.raises(ValueError, match="invalid strategy name"):
        pytorch_lightning.Trainer(accelerator="cpu", devices=2, strategy=SSPStrategy())
    assert lightning_hybrid.SSPStrategy is not SSPStrategy


#: mypy on a user's two lines: our package followed, the big libraries' own code skipped (seconds, not minutes).
MYPY_CONFIG = """[mypy]
follow_imports = silent
ignore_missing_imports = True
incremental = False
[mypy-torch.*,lightning.*,pytorch_lightning.*,lightning_fabric.*,torchmetrics.*,hydra.*,omegaconf.*,numpy.*,scipy.*]
follow_imports = skip
"""


def test_a_type_checker_resolves_our_classes_under_each_namespace(tmp_path):
    """``from lightning_hybrid.lightning import SSPStrategy`` resolves to the generated class (no import hook
    for a type checker to miss). MYPYPATH names this checkout: mypy cannot follow an editable install's
    finder, and a wheel ships py.typed."""
    pytest.importorskip("mypy", reason="mypy is in the test extra (pip install -e '.[test]'); this check needs it")
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    for namespace_module, expected in (("lightning_hybrid.lightning", "lightning_hybrid.lightning.strategies.ssp.SSPStrategy"),
                                       ("lightning_hybrid", "lightning_hybrid.strategies.ssp.SSPStrategy")):
        script = tmp_path / "user.py"
        script.write_text(f"from {namespace_module} import SSPStrategy\nreveal_type(SSPStrategy)\n")
        proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), str(script)],
                              env=clean_env(MYPYPATH=str(TESTS.parent)), cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert f"-> {expected}\"" in proc.stdout, proc.stdout + proc.stderr
        assert (TESTS.parent / "lightning_hybrid" / "py.typed").is_file()


def fit(out: Path, *args: str) -> dict:
    """tests/support/namespace_script.py in a new interpreter (the tests' zygote has imported pytorch_lightning)."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(SUPPORT / "namespace_script.py"), str(out), *args], env=clean_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out / "result.pt")


@pytest.mark.multiprocess
def test_a_user_s_module_trains_in_either_namespace_with_or_without_the_other_installed(tmp_path):
    # Both installed, `lightning`: tests/repository/test_tutorial.py (every alias) and the alias test above.
    only_lightning = fit(tmp_path / "lightning", "--namespace", "lightning", "--strategy", "delayed_averaging",
                         "--block", "pytorch_lightning", "lightning_fabric")
    only_pl = fit(tmp_path / "pl", "--namespace", "pytorch_lightning", "--strategy", "delayed_averaging", "--block", "lightning")
    # Only `lightning` installed: the alias builds the lightning flavour's class, and nothing imports pytorch_lightning.
    assert only_lightning["strategy"] == "lightning_hybrid.lightning.strategies.delayed_averaging_strategy.DelayedAveragingStrategy"
    assert only_pl["strategy"] == "lightning_hybrid.strategies.delayed_averaging_strategy.DelayedAveragingStrategy"
    assert only_lightning["loaded"] == ["lightning"] and only_pl["loaded"] == ["pytorch_lightning"]
    for result in (only_lightning, only_pl):
        assert result["reports"] == 2, "the straggler report ran at each epoch's end"
        for name, value in result["params"].items():  # the same run, whichever Lightning ran it
            torch.testing.assert_close(value, only_pl["params"][name], rtol=0, atol=0)


@pytest.mark.multiprocess
def test_the_command_line_runs_where_only_lightning_is_installed(tmp_path):
    blocked = ("import importlib.abc, runpy, sys\n"
               "class U(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('pytorch_lightning', 'lightning_fabric'):\n"
               "            raise ModuleNotFoundError(name, name=name)\n"
               "sys.meta_path.insert(0, U())\n"
               "sys.argv = ['lightning-hybrid', *sys.argv[1:]]\n"
               "runpy.run_module('lightning_hybrid.cli', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", blocked, "experiment=smoke", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                           "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false",
                           f"hydra.run.dir={tmp_path / 'run'}"],
                          env=clean_env(HYDRA_FULL_ERROR="1"), cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_the_staleness_check_runs_on_a_bare_checkout_and_names_a_stale_file(tmp_path):
    """``python3 tools/generate_lightning_namespace.py --check`` (CI's first step, the pre-commit hook): plain
    Python, no package installed; exit 0 on a current tree, 1 naming the file once a glue module changes."""
    import shutil

    root = Path(namespace.__file__).parents[1]
    for folder in ("lightning_hybrid", "tools"):
        shutil.copytree(root / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    bare = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}

    def check() -> subprocess.CompletedProcess:
        return subprocess.run(["/usr/bin/env", "-i", f"PATH={bare.get('PATH', '/usr/bin:/bin')}", sys.executable, "-I",
                               "tools/generate_lightning_namespace.py", "--check"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)

    current = check()
    assert current.returncode == 0, current.stdout + current.stderr
    with open(tmp_path / "lightning_hybrid" / "straggler.py", "a") as f:
        f.write("\n\ndef added(rank: int) -> int:\n    return rank\n")
    stale = check()
    assert stale.returncode == 1 and "stale: lightning_hybrid/lightning/straggler.py" in stale.stdout, stale.stdout + stale.stderr


def test_both_flavours_import_and_build_their_strategies_from_pyc_files_alone(tmp_path):
    """A wheel of ``.pyc`` files only (no source) works: the flavour is ordinary modules, read from their code objects
    (the design before read each glue module's source at import)."""
    import compileall
    import shutil

    package = tmp_path / "lightning_hybrid"
    shutil.copytree(Path(lightning_hybrid.__file__).parent, package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "configs"))
    assert compileall.compile_dir(package, quiet=1, legacy=True)  # module.pyc beside module.py, as such wheels ship
    for source in package.rglob("*.py"):
        source.unlink()
    script = ("import warnings, lightning as L, pytorch_lightning as pl, lightning_hybrid.lightning as LH\n"
              "import lightning_hybrid\n"
              "assert lightning_hybrid.__file__.endswith('__init__.pyc'), lightning_hybrid.__file__\n"
              "for trainer in (L.Trainer, pl.Trainer):\n"
              "    strategy = trainer(accelerator='cpu', devices=2, strategy='ssp_delay', logger=False).strategy\n"
              "    print(type(strategy).__module__)\n"
              "print(LH.DelayedAveragingStrategy.__module__)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path)),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["lightning_hybrid.lightning.strategies.ssp", "lightning_hybrid.strategies.ssp",
                                   "lightning_hybrid.lightning.strategies.delayed_averaging_strategy"]
