"""``CFMCalculator``: mace's ASE calculator with the fused cfm-plugins kernels swapped in.

It is :class:`mace.calculators.MACECalculator` (same arguments, data conversion, neighbour lists,
committee and unit handling, same results), except that:

- models are loaded by :mod:`cfm_plugins.calculators.loading` (clear errors) and, once mace has
  moved and converted them, patched in place by :func:`cfm_plugins.ops.patching.patch_model`
  (``kernels=`` chooses what to fuse; ``fused=False`` keeps the stock modules, to compare);
- :meth:`CFMCalculator.get_properties_batch` evaluates many structures in one model call;
- a structure the model cannot evaluate (an unknown element, a NaN position, a zero or flat
  periodic cell, no atoms) is a ``ValueError`` naming the atoms (:mod:`.atoms_checks`);
- ``skin=`` keeps the neighbour list between MD steps (:mod:`.mace_graph`; default on CUDA);
- ``static_shapes=True`` pads every evaluation to a budget that grows in steps (each logged), and
  ``compile=`` compiles the forward with forces once per budget (:mod:`cfm_plugins.static_shapes`).
This module imports mace; ``cfm_plugins.calculators`` imports it when ``CFMCalculator`` is used.
"""

from __future__ import annotations

import logging
import warnings

import torch
from ase.calculators.singlepoint import SinglePointCalculator
from ase.stress import full_3x3_to_voigt_6_stress
from mace import data as mace_data
from mace.calculators import MACECalculator
from mace.tools import torch_geometric, torch_tools

from cfm_plugins.calculators.atoms_checks import check_atoms
from cfm_plugins.calculators.loading import (
    check_device,
    check_mace_model,
    expand_model_paths,
    load_mace_model,
    load_mace_weights,
    model_dtype,
)

log = logging.getLogger("cfm_plugins.calculators")

#: ``kernels``' default: every kernel the model has a module for, as the ``fused`` plugin's
#: ``fused_kernels=auto`` (a kernel whose GPU path no GPU has timed, the skip connection's, runs
#: its kernels on CPUs only; name it to run it on GPUs)
DEFAULT_KERNELS = "auto"
#: per-structure results of :meth:`CFMCalculator.get_properties_batch`
BATCH_PROPERTIES = ("energy", "free_energy", "forces", "stress", "energies", "node_energy")


class CFMCalculator(MACECalculator):
    """ASE calculator for stock MACE model files, evaluated with the cfm-plugins fused kernels.

    A :class:`mace.calculators.MACECalculator` (same data conversion, committees, units and
    results) whose models are patched in place with the fused kernels after mace has moved them
    to ``device`` and ``default_dtype``. Keyword arguments not listed here are
    ``MACECalculator``'s (``energy_units_to_eV``, ``length_units_to_A``, ``model_type``,
    ``head``, ...).

    Args:
        model_paths: a MACE model file, a glob such as ``"mace_*.model"`` (a committee), or a
            list of files. Exactly one of ``model_paths`` and ``models``.
        device: ``"cpu"`` or ``"cuda"`` / ``"cuda:<index>"``.
        default_dtype: ``"float64"`` (default) or ``"float32"``: a model of another dtype is
            converted to it, with a warning (as ``MACECalculator`` does); ``""`` keeps the
            model's dtype.
        models: loaded MACE modules (one or a list) instead of files.
        kernels: the fused kernels to swap in: ``"auto"`` (default: every kernel the model has a
            module for; the skip connection's untimed GPU kernel stays off on GPUs), or names out
            of ``("symmetric_contraction", "conv_tp", "skip_tp")`` (or a kernel registered in
            :mod:`cfm_plugins.ops.kernel_table`); a named kernel runs on every device.
        fused: ``False`` keeps mace's own modules (the stock calculator, for comparisons).
        compile_mode: mace's own ``compile_mode``; it rebuilds the model without the fused
            kernels, so it needs ``fused=False`` (``compile`` compiles with them).
        weights_only: ``False`` (default, as mace): ``model_paths`` are whole pickled models,
            unpickled (load only files you trust). ``True``: they are state_dicts or mace
            training checkpoints, read with ``torch.load(weights_only=True)`` (no code from the
            file runs) into copies of ``architecture``.
        architecture: with ``weights_only=True``, a MACE model of the same configuration as the
            weights (or a callable returning one); it is copied, not modified.
        compile: ``"off"`` (default), ``"default"``, ``"max-autotune"`` or ``"reduce-overhead"``
            (CUDA graphs; GPUs only): ``torch.compile`` of the model's forward with forces, the
            fused kernels inside, one graph per shape (a model holding TorchScript is rebuilt
            from its configuration first, weights kept).
        compile_backend: ``torch.compile``'s backend; ``"aot_eager"`` runs the captured graphs
            without code generation (tests, debugging).
        static_shapes: pad every evaluation to a budget of atoms, edges and graphs, so that a
            compiled model sees few shapes (default: on when compiling). The budget starts at the
            first structure's size plus ``budget_headroom`` and grows in steps, each logged.
        budget_headroom: the fraction added to a budget when it is made or raised.
        skin: for MD, a distance in Angstrom (0.5-2 suits room-temperature MD): the neighbour
            list is built with ``r_max + skin`` and kept while no atom has moved more than
            ``skin / 2`` and the cell and configuration are the same; each step keeps the pairs
            closer than ``r_max`` (the same edges as mace's list, maybe in another order).
            ``None``: mace's conversion at every evaluation. ``"auto"`` (default): 1.0 on a CUDA
            device, where rebuilding the list costs a large part of the step; ``None`` on a CPU
            (the model's step hides it) and with ``compile_mode``.
        **kwargs: passed to ``MACECalculator``.

    Attributes:
        patch_reports: one :class:`~cfm_plugins.ops.patching.PatchReport` per model (what was
            swapped).
        md_graphs: with ``skin``, the kept neighbour lists (``md_graphs.neighbours.builds`` and
            ``.reuses`` count the lists built and kept).

    Raises:
        ValueError: an unknown kernel or dtype, ``compile`` with ``compile_mode``, ``skin`` with
            ``compile_mode``, both or neither of ``model_paths`` and ``models``, ``architecture``
            without ``weights_only``, a negative ``budget_headroom``, a whole pickled model
            under ``weights_only=True``.
        NotImplementedError: the fused kernels with mace's ``compile_mode``.
        FileNotFoundError: a model file that does not exist.
        TypeError: a file or module that is not a MACE model.
        RuntimeError: a CUDA ``device`` where torch sees no GPU.

    A structure the model cannot evaluate (an element it was not trained on, a NaN position, a
    zero or flat periodic cell, no atoms) is a ``ValueError`` naming the atoms, at evaluation.
    """

    def __init__(
        self,
        model_paths=None,
        device: str = "cpu",
        default_dtype: str = "float64",
        *,
        models=None,
        kernels=DEFAULT_KERNELS,
        fused: bool = True,
        compile_mode=None,
        weights_only: bool = False,
        architecture=None,
        compile: str = "off",
        compile_backend: str = "inductor",
        static_shapes: bool | None = None,
        budget_headroom: float = 0.05,
        skin: float | str | None = "auto",
        **kwargs,
    ):
        from cfm_plugins.ops.kernel_table import check_kernels, kernel_names
        from cfm_plugins.plugins.fused import refuse_other_kernels

        auto = isinstance(kernels, str) and kernels == "auto"
        if not fused:
            kernels = ()
        else:
            kernels = (
                kernel_names(auto=True) if auto else check_kernels(kernels, "CFMCalculator kernels")
            )
        if default_dtype not in ("", "float32", "float64"):
            raise ValueError(
                f"default_dtype={default_dtype!r}; expected 'float32', 'float64' or '' (the "
                "model's)"
            )
        refuse_other_kernels(
            kernels,
            kwargs.get("enable_cueq"),
            kwargs.get("enable_oeq"),
            "pass fused=False to use them",
        )
        if kernels and compile_mode is not None:
            raise NotImplementedError(
                "compile_mode with the fused kernels is not supported: mace's compile path "
                "rebuilds the model from its configuration and would drop the fused modules; use "
                "compile='default' (ours, fused kernels inside) or fused=False for mace's compile"
            )
        from cfm_plugins.static_shapes.forward import check_compile_mode

        check_compile_mode(compile, device, compile_backend)
        if compile != "off" and compile_mode is not None:
            raise ValueError("give compile= (cfm-plugins) or compile_mode= (mace's), not both")
        if budget_headroom < 0:
            raise ValueError(f"budget_headroom={budget_headroom!r} must be >= 0")
        from cfm_plugins.calculators.skin_list import default_skin

        skin = default_skin(skin, device, compile_mode)
        if skin is not None and compile_mode is not None:
            raise ValueError(
                "skin= keeps the neighbour list between steps in CFMCalculator's own batches; "
                "mace's compile_mode pads them its own way: give one of them"
            )
        if (model_paths is None) == (models is None):
            raise ValueError(
                "give exactly one of model_paths (MACE model files) or models (loaded modules)"
            )
        check_device(device)

        if (weights_only or architecture is not None) and models is not None:
            raise ValueError(
                "weights_only/architecture apply to model_paths; models= are already loaded modules"
            )
        if architecture is not None and not weights_only:
            raise ValueError(
                "architecture= is used only with weights_only=True (to load state_dicts into)"
            )
        if models is None:
            paths = expand_model_paths(model_paths)
            models = [
                load_mace_weights(p, architecture, device)
                if weights_only
                else load_mace_model(p, device)
                for p in paths
            ]
            sources = [str(p) for p in paths]
        else:
            models = list(models) if isinstance(models, (list, tuple)) else [models]
            models = [check_mace_model(m, f"models[{i}]") for i, m in enumerate(models)]
            sources = [f"models[{i}]" for i in range(len(models))]
        if default_dtype:
            for i, model in enumerate(models):
                if model_dtype(model) != default_dtype:
                    warnings.warn(
                        f"MACE model {sources[i]} is {model_dtype(model)}; converting it to "
                        f"default_dtype={default_dtype} (as MACECalculator does)",
                        stacklevel=2,
                    )

        super().__init__(
            models=models,
            device=device,
            default_dtype=default_dtype,
            compile_mode=compile_mode,
            **kwargs,
        )
        self.kernels = kernels
        self.fused = bool(kernels)
        self._auto_kernels = auto and self.fused  # patched as fused_kernels=auto
        self.compile = compile
        self.static_shapes = (compile != "off") if static_shapes is None else bool(static_shapes)
        if compile != "off":
            self._without_torchscript()
        self.patch_reports = [self._patch(model) for model in self.models]
        # the BudgetTracker of the padded evaluations (static_shapes), made at the first one
        self.budget = None
        self.budget_headroom = float(budget_headroom)
        self.md_graphs = None  # with skin: the graph of the last structure, made again from it (MD)
        if skin is not None:
            from cfm_plugins.calculators.mace_graph import MDGraphs

            self.md_graphs = MDGraphs(self.r_max, skin, self.z_table, self.available_heads)
            log.info(
                "CFMCalculator: the neighbour list is kept between MD steps (skin %g A; skin=None "
                "rebuilds it at every evaluation, as mace does)",
                skin,
            )
        if compile == "off" and str(device).startswith("cuda") and self.kernels:
            log.info(
                "CFMCalculator: for long MD on a GPU, compile='reduce-overhead' captures the step "
                "in CUDA graphs; it compiles once per padded size first, about a minute before "
                "the first step, so it pays on long runs only (docs/inference.md)"
            )
        if compile != "off" or self.static_shapes:
            from cfm_plugins.static_shapes import mace as static_mace
            from cfm_plugins.static_shapes.forward import install

            for model in self.models:
                install(
                    model,
                    static_mace.MACE_SPEC,
                    compile=compile,
                    dynamic=False if self.static_shapes else None,
                    backend=compile_backend,
                )

    def _without_torchscript(self) -> None:
        """Compiling needs models without TorchScript (e3nn's code generation): rebuild those that
        hold it."""
        from cfm_plugins.static_shapes.mace import holds_torchscript, without_torchscript

        for i, model in enumerate(self.models):
            if holds_torchscript(model):
                log.info(
                    "CFMCalculator: rebuilding model %d without TorchScript modules so it can be "
                    "compiled",
                    i,
                )
                self.models[i] = without_torchscript(model)
                for p in self.models[i].parameters():
                    p.requires_grad = False

    def _patch(self, model):
        from cfm_plugins.ops.patching import PatchReport, patch_model

        if not self.kernels:
            return PatchReport({})
        report = patch_model(model, None if self._auto_kernels else self.kernels)
        for p in model.parameters():  # as MACECalculator leaves them: inference only
            p.requires_grad = False
        if report.missing and not (self._auto_kernels and report.total):
            warnings.warn(
                f"fused kernels {list(report.missing)}: no matching module found in the model; "
                "those parts run mace's own code",
                stacklevel=3,
            )
        log.info("CFMCalculator: fused kernels swapped in: %s", report)
        return report

    # ------------------------------------------------------------------------- batches
    def _atoms_list_to_batch(self, atoms_list):
        """One torch_geometric batch of all structures (mace's own conversion and neighbour list),
        padded to the calculator's budget with ``static_shapes``."""
        self.arrays_keys.update({self.charges_key: "charges"})
        keyspec = mace_data.KeySpecification(info_keys=self.info_keys, arrays_keys=self.arrays_keys)
        with torch_tools.default_dtype(self.default_dtype):
            configs = [
                mace_data.config_from_atoms(atoms, key_specification=keyspec, head_name=self.head)
                for atoms in atoms_list
            ]
            if (
                self.md_graphs is not None and len(configs) == 1
            ):  # one structure at a time: a trajectory
                graphs = [self.md_graphs.graph(configs[0])]
            else:
                graphs = [
                    mace_data.AtomicData.from_config(
                        c, z_table=self.z_table, cutoff=self.r_max, heads=self.available_heads
                    )
                    for c in configs
                ]
        if not self.static_shapes:
            return torch_geometric.Batch.from_data_list(graphs).to(self.device)
        return self._padded(graphs).to(self.device)

    def _padded(self, graphs):
        """``graphs`` as one :class:`~cfm_plugins.static_shapes.mace.PaddedBatch` in the models'
        dtype, padded to the budget (made from the first batch, raised in steps by a larger one,
        logged)."""
        from cfm_plugins.static_shapes.budget import BudgetTracker, budget_for
        from cfm_plugins.static_shapes.mace import PaddingCollater, batch_sizes

        if self.budget is None:
            self.budget = BudgetTracker(
                budget_for(*batch_sizes(graphs), self.budget_headroom),
                self.budget_headroom,
                "CFMCalculator",
            )
            log.info("CFMCalculator: static shapes, evaluations padded to %s", self.budget.budget)
        dtype = next(self.models[0].parameters()).dtype
        collate = PaddingCollater(
            torch_geometric.Batch.from_data_list, self.budget, 2.0 * max(float(self.r_max), 1.0)
        )
        batch = collate(graphs)
        for (
            key
        ) in batch.padded.keys:  # mace converts the batch's floats to the model's dtype key by key:
            value = batch.padded[
                key
            ]  # do it on the padded tensors, so that conversion finds nothing to do
            if torch.is_tensor(value) and torch.is_floating_point(value):
                batch.padded[key] = value.to(dtype)
        return batch.remake_views()

    def _atoms_to_batch(self, atoms):
        """mace's conversion of one structure (``calculate``); padded with ``static_shapes``; with
        ``skin``, the neighbour list and graph of the last structure made again (:class:`MDGraphs`).
        A structure the model cannot evaluate is a ``ValueError`` saying why
        (:func:`check_atoms`)."""
        check_atoms(atoms, self.z_table.zs)
        if not self.static_shapes and self.md_graphs is None:
            return super()._atoms_to_batch(atoms)
        return self._atoms_list_to_batch([atoms])

    def _evaluate_batch(self, atoms_list) -> list[dict]:
        batch = self._atoms_list_to_batch(atoms_list)
        ptr = batch["ptr"].tolist()
        per_model = []
        for model in self.models:
            data = batch.clone()
            dtype = next(model.parameters()).dtype
            for key in data.keys:
                value = data[key]
                if torch.is_tensor(value) and torch.is_floating_point(value):
                    data[key] = value.to(dtype=dtype)
            out = model(data.to_dict(), compute_stress=True, training=False)
            per_model.append(
                {
                    k: out[k].detach()
                    for k in ("energy", "forces", "stress", "node_energy")
                    if out.get(k) is not None
                }
            )
        mean = {
            k: torch.stack([o[k] for o in per_model]).mean(0).cpu().numpy() for k in per_model[0]
        }
        node_heads = batch["head"][batch["batch"]]
        node_e0 = (
            self.models[0]
            .atomic_energies_fn(batch["node_attrs"])[torch.arange(len(node_heads)), node_heads]
            .detach()
            .cpu()
            .numpy()
        )

        e_conv = self.energy_units_to_eV
        f_conv = self.energy_units_to_eV / self.length_units_to_A
        s_conv = self.energy_units_to_eV / self.length_units_to_A**3
        results = []
        for g in range(len(atoms_list)):
            lo, hi = ptr[g], ptr[g + 1]
            res = {"energy": float(mean["energy"][g]) * e_conv}
            res["free_energy"] = res["energy"]
            if "forces" in mean:
                res["forces"] = mean["forces"][lo:hi] * f_conv
            if "stress" in mean:
                res["stress"] = full_3x3_to_voigt_6_stress(mean["stress"][g] * s_conv)
            if "node_energy" in mean:
                res["energies"] = mean["node_energy"][lo:hi] * e_conv
                res["node_energy"] = res["energies"] - node_e0[lo:hi] * e_conv
            results.append(res)
        return results

    def get_properties_batch(
        self, atoms_list, max_atoms: int | None = None, attach: bool = False
    ) -> list[dict]:
        """Energy, forces, stress, per-atom energies of many structures, several per model call.

        Args:
            atoms_list: the structures (``ase.Atoms``).
            max_atoms: split the list into consecutive batches of at most that many atoms (a
                larger structure goes alone); ``None``: one batch.
            attach: also give each ``Atoms`` a ``SinglePointCalculator`` with its results.

        Returns:
            One dict per structure with the keys of :data:`BATCH_PROPERTIES`: the values
            ``calc.get_property`` would give for that structure alone (committees averaged).

        Raises:
            NotImplementedError: a model type other than ``MACE`` or ``EnergyDipoleMACE``.
            ValueError: a structure the model cannot evaluate, naming it and why.
        """
        if self.model_type not in ("MACE", "EnergyDipoleMACE"):
            raise NotImplementedError(
                f"get_properties_batch supports energy models (MACE), not {self.model_type}"
            )
        atoms_list = list(atoms_list)
        for i, atoms in enumerate(atoms_list):
            check_atoms(atoms, self.z_table.zs, f"structure {i} of the list")
        chunks, current, count = [], [], 0
        for atoms in atoms_list:
            if current and max_atoms is not None and count + len(atoms) > max_atoms:
                chunks.append(current)
                current, count = [], 0
            current.append(atoms)
            count += len(atoms)
        if current:
            chunks.append(current)
        results = [res for chunk in chunks for res in self._evaluate_batch(chunk)]
        if attach:
            for atoms, res in zip(atoms_list, results):
                atoms.calc = SinglePointCalculator(
                    atoms, **{k: v for k, v in res.items() if k != "node_energy"}
                )
        return results

    def __repr__(self) -> str:
        kernels = ",".join(self.kernels) or "none (stock mace)"
        return (
            f"CFMCalculator({self.num_models} model(s), device={str(self.device)!r}, "
            f"dtype={self.default_dtype}, fused={kernels})"
        )


__all__ = ["CFMCalculator", "BATCH_PROPERTIES", "DEFAULT_KERNELS"]
