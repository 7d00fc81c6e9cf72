"""What mace_run_train would train on, checked before it trains (mace-torch 0.3.16).

- :class:`Sources` numbers every structure mace reads from an ASE file by its place in that file,
  so that messages can name it.
- :func:`check_labels`: a NaN or infinite label or position in the training file stops the run
  before training, naming the file, the structure and the property; in the validation or test
  files it is a warning.
- :func:`check_elements`: a structure of any file with an element outside mace's atomic number
  table stops the run at start.
- HDF5 and LMDB data (read lazily by mace) are checked the same way where their sizes are read
  (:mod:`.sizes`, each rank its share, the ranks agreeing on what was found): :func:`lazy_findings`
  gives the message, :class:`DataCheckError` stops every rank alike.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from cfm_plugins.api import UsageError, not_finite

log = logging.getLogger("cfm_plugins.mace")

#: structures listed in one message
SHOWN = 10


class Sources:
    """``(file, index in the file)`` of the structures mace reads from ASE files.

    Every structure mace reads from an ASE file (``--train_file``, ``--valid_file``,
    ``--test_file``) is numbered by its place in that file: mace's configurations carry no such
    thing, and its random split (``--valid_fraction``) and the isolated atoms it takes out
    (``config_type=IsolatedAtom``) shift the order. The numbers name structures in messages: here,
    and in the error of a non-finite training loss (:mod:`.guard`).

    Installed as two seams of ``mace.data.utils`` (see :mod:`.seams`): the ``ase`` module that
    ``load_from_xyz`` reads with (:meth:`ase_proxy`: ``ase.io.read(file, index=":")`` numbers the
    frames it returns) and ``config_from_atoms_list`` (:meth:`wrap_configs`: each configuration
    made from a numbered frame gets ``_cfm_source``). The training loader's AtomicData are tied to
    their configuration by :meth:`register_dataset` (``load_dataset_for_path``), so that a training
    batch's structures can be named (:meth:`of_item`).
    """

    def __init__(self):
        self._frames: dict[int, tuple[str, int]] = {}  # id(Atoms) -> source, while mace reads
        self._items: dict[int, tuple[str, int]] = {}  # id(AtomicData) -> source

    # -- numbering the frames ------------------------------------------------------------------
    def ase_proxy(self, ase_module):
        sources = self

        class _IO:
            def __getattr__(self, name):
                return getattr(ase_module.io, name)

            def read(self, filename, index=None, *args, **kwargs):
                out = ase_module.io.read(filename, index, *args, **kwargs)
                if index == ":" and isinstance(out, list):
                    name = os.fspath(filename) if hasattr(filename, "__fspath__") else filename
                    for i, atoms in enumerate(out):
                        sources._frames[id(atoms)] = (str(name), i)
                return out

        class _Ase:
            io = _IO()

            def __getattr__(self, name):
                return getattr(ase_module, name)

        return _Ase()

    def wrap_configs(self, stock):
        def config_from_atoms_list(atoms_list, *args, **kwargs):
            configs = stock(atoms_list, *args, **kwargs)
            for atoms, config in zip(atoms_list, configs):
                source = self._frames.get(id(atoms))
                if source is not None:
                    config._cfm_source = source
            self._frames.clear()  # the frames go; their ids may be reused
            return configs

        return config_from_atoms_list

    # -- the training loader's items -----------------------------------------------------------
    def register_dataset(self, dataset, collection) -> None:
        """Tie mace's AtomicData list (made from ``collection`` in order) to their sources."""
        if not isinstance(dataset, list) or collection is None or len(dataset) != len(collection):
            return
        for item, config in zip(dataset, collection):
            source = getattr(config, "_cfm_source", None)
            if source is not None:
                self._items[id(item)] = source

    def of_item(self, dataset, index):
        """The source of item ``index`` of an in-memory list of AtomicData, or None."""
        if not isinstance(dataset, list) or not 0 <= index < len(dataset):
            return None
        return self._items.get(id(dataset[index]))

    def clear(self) -> None:
        self._frames.clear()
        self._items.clear()


def source_of(config, fallback: str):
    found = getattr(config, "_cfm_source", None)
    return found if found is not None else (fallback, None)


def _where(src) -> str:
    path, index = src
    return f"structure {index} of {path}" if index is not None else f"a structure of {path}"


def _listing(found: list[tuple[tuple, str]]) -> str:
    shown = "; ".join(f"{_where(src)}: {what}" for src, what in found[:SHOWN])
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return f"{shown}{more} (structures counted from 0, in file order)"


# ------------------------------------------------------------------------------------- labels
def bad_values(config) -> list[str]:
    """The names of ``config``'s positions, cell and properties that hold NaN or inf."""
    bad = []
    if not np.all(np.isfinite(np.asarray(config.positions, dtype=np.float64))):
        bad.append("positions")
    pbc = np.asarray(config.pbc if config.pbc is not None else (), dtype=bool)
    if config.cell is not None and pbc.any():
        cell = np.asarray(config.cell, dtype=np.float64).reshape(3, 3)
        if not np.all(np.isfinite(cell[pbc])):
            bad.append("cell")
    return bad + not_finite((config.properties or {}).items())


def check_labels(collections, files: dict[str, str], atomic_energies=None) -> None:
    """Raise ValueError for non-finite values in the training configurations; warn for the
    validation and test ones. ``files``: role -> the files, for messages.

    A position, energy, force, stress, virial or other property that is NaN or infinite in the
    training file stops the run before training, naming the file, the structure's index and the
    property. mace's statistics (E0s by average, the scale and shift of the model) read every
    training label, so one NaN force makes the model itself NaN before the first step: no option
    can skip it. Non-finite isolated-atom energies (``atomic_energies``, mace's E0s) stop it too.
    The same in the validation or test files is a warning (the model trains; those sets' metrics
    will be NaN).
    """
    found = {"train": [], "valid": [], "test": []}
    parts = [("train", collections.train), ("valid", collections.valid)] + [
        ("test", configs) for _, configs in (collections.tests or [])
    ]
    for role, configs in parts:
        for config in configs or []:
            bad = bad_values(config)
            if bad:
                src = source_of(config, files.get(role, role))
                found[role].append((src, ", ".join(bad) + " not finite"))
    for role, what, then in (
        ("valid", "validation", "the validation metrics, and mace's choice of the best epoch"),
        ("test", "test", "the test metrics"),
    ):
        if found[role]:
            log.warning(
                "mace_run_train: %d %s structure(s) hold values that are not finite (the model "
                "trains, but %s will be NaN): %s",
                len(found[role]),
                what,
                then,
                _listing(found[role]),
            )
    bad_e0 = {z: e for z, e in (atomic_energies or {}).items() if not np.isfinite(e)}
    if bad_e0:
        elements = ", ".join(f"{_symbol(int(z))} (Z={z}): {e}" for z, e in sorted(bad_e0.items()))
        raise ValueError(
            f"mace_run_train: the isolated-atom energies (config_type=IsolatedAtom) in "
            f"{files.get('train', 'the training file')} are not finite ({elements}): mace takes "
            "its E0s from them; fix or remove those frames, or give --E0s"
        )
    if found["train"]:
        raise ValueError(
            f"mace_run_train: {len(found['train'])} training structure(s) hold values that are "
            f"not finite: {_listing(found['train'])}. mace computes its statistics (E0s, the "
            "model's scale and shift) from every training label, so the model would be NaN "
            "before its first step: fix or remove these structures"
        )


# ----------------------------------------------------------------------------------- elements
def _symbol(z: int) -> str:
    from ase.data import chemical_symbols

    return chemical_symbols[z] if 0 < z < len(chemical_symbols) else "?"


def _odd(numbers, known: set[int]) -> list[int]:
    return sorted({int(z) for z in np.unique(np.asarray(numbers, dtype=np.int64))} - known)


def unknown_elements(configs, known: set[int], fallback: str) -> list[tuple[tuple, list[int]]]:
    """``[(source, [atomic numbers not in known]), ...]`` of the configurations that have any."""
    found = []
    for config in configs or []:
        odd = _odd(config.atomic_numbers, known)
        if odd:
            found.append((source_of(config, fallback), odd))
    return found


def hdf5_unknown_elements(path: str, known: set[int]) -> list[tuple[tuple, list[int]]]:
    """The same for an HDF5 file of mace's ``preprocess_data`` (``--test_dir``): only the atomic
    numbers are read; the index is mace's (``config_batch_B/config_C``: ``B * size + C``)."""
    import h5py

    found = []
    with h5py.File(path, "r") as h5:
        batches = sorted(
            (k for k in h5.keys() if k.startswith("config_batch_")),
            key=lambda k: int(k.rsplit("_", 1)[1]),
        )
        size = len(h5[batches[0]].keys()) if batches else 0
        for key in batches:
            b = int(key.rsplit("_", 1)[1])
            for name, group in h5[key].items():
                if "atomic_numbers" not in group:
                    continue
                odd = _odd(group["atomic_numbers"][()], known)
                if odd:
                    found.append(((path, b * size + int(name.rsplit("_", 1)[1])), odd))
    return found


def check_elements(heads, zs, test_dir: str | None = None, multi_processed: bool = False) -> None:
    """Raise ValueError naming every structure with an element outside ``zs`` (mace's atomic
    number table): ``heads`` are ``(collections, files)`` pairs of :func:`check_labels`.

    mace learns the elements of its atomic number table (``--atomic_numbers``, else those of the
    training and validation sets). A structure of any file (the test files and ``test_dir``'s
    HDF5 files included, unless ``multi_processed``) with an element outside the table stops the
    run at start, naming the file, the structures and the element, instead of after training with
    numpy's ``79 is not in list`` and no final model.
    """
    known = {int(z) for z in zs}
    found = []
    for collections, files in heads:
        found += unknown_elements(collections.train, known, files.get("train", "train"))
        found += unknown_elements(collections.valid, known, files.get("valid", "valid"))
        for _, configs in collections.tests or []:
            found += unknown_elements(configs, known, files.get("test", "test"))
    if test_dir and not multi_processed and os.path.isdir(test_dir):
        for name in sorted(os.listdir(test_dir)):
            if name.endswith("_test.h5"):
                found += hdf5_unknown_elements(os.path.join(test_dir, name), known)
    if found:
        raise ValueError(unknown_elements_message(found, known))


def unknown_elements_message(found: list[tuple[tuple, list[int]]], known) -> str:
    """The error for ``found`` (``[(source, [atomic numbers]), ...]``) against the table
    ``known``."""
    table = ", ".join(f"{_symbol(z)} ({z})" for z in sorted(known))
    missing = sorted({z for _, zs_ in found for z in zs_})
    named = [(src, ", ".join(f"{_symbol(z)} (Z={z})" for z in zs_)) for src, zs_ in found]
    return (
        f"mace_run_train: {len(found)} structure(s) hold elements the model does not know (its "
        f"atomic numbers are {table}: --atomic_numbers, else the elements of the training and "
        f"validation sets): {_listing(named)}. mace would fail on them after training, with no "
        f"final model. Remove these structures from their file, or add "
        f"{', '.join(str(z) for z in missing)} to --atomic_numbers (with an E0 for each in --E0s; "
        "the model has no training data for them)"
    )


# ------------------------------------------------------------------------- HDF5 and LMDB data
class DataCheckError(UsageError):
    """Data that cannot be trained on, found where every rank reads its share of the sizes (HDF5
    and LMDB): the ranks gather what each found, so each raises this alike and cfm-run says it
    once (rank 0), without a traceback, and exits 2."""


#: what a role's non-finite labels do: (raise?, the set named, what turns NaN)
_ROLES = {
    "train": (True, "training", ""),
    "valid": (False, "validation", "the validation metrics, and mace's choice of the best epoch"),
    "test": (False, "test", "the test metrics"),
}


def lazy_findings(role: str, labels, elements, known) -> str | None:
    """What the sizes pass found in HDF5/LMDB data of ``role`` (train, valid, test), as
    ``("error", message)`` (unknown ``elements``, or non-finite ``labels`` of training data),
    ``("warning", message)`` (non-finite labels of validation or test data) or None (nothing).
    ``labels``: ``[(source, "energy not finite"), ...]``; ``elements``: ``[(source, [atomic
    numbers]), ...]``; a source is ``(file, index in it)``."""
    if elements:
        return ("error", unknown_elements_message(sorted(elements), known))
    if not labels:
        return None
    fatal, what, then = _ROLES.get(role, _ROLES["test"])
    labels = sorted(labels)
    if fatal:
        return (
            "error",
            f"mace_run_train: {len(labels)} training structure(s) hold values that are not "
            f"finite: {_listing(labels)}. mace computes its statistics (E0s, the model's scale "
            "and shift) from every training label, so the model would be NaN before its first "
            "step: fix or remove these structures",
        )
    return (
        "warning",
        f"mace_run_train: {len(labels)} {what} structure(s) hold values that are not finite (the "
        f"model trains, but {then} will be NaN): {_listing(labels)}",
    )
