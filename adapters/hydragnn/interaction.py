"""HydraGNN's MACE interaction block with its tensor product and scatter as one fused kernel.

HydraGNN's MACE stack (its source: ``hydragnn/utils/model/mace_utils/modules/blocks.py``) builds
every message in ``RealAgnosticAttResidualInteractionBlock.forward``: it gathers the senders'
features, calls the e3nn uvu ``conv_tp`` on them (one row per edge) and sums the per-edge messages
into the receivers with torch_scatter. The block has no ``conv_fusion`` seam as mace-torch's
blocks have, so the kernel table's generic uvu form could swap the product alone, and the per-edge
messages and their gradients would stay (``[edges, 336]`` float64 tensors per layer at hidden_dim
16). :func:`form` (kernel ``conv_tp``; :func:`register_form` puts it first, the adapter does when
``fused`` is enabled) swaps the whole block for a :class:`FusedInteractionBlock` (the same
submodules and state_dict), so gather, product and scatter are one kernel and no per-edge message
exists. A HydraGNN whose block computes something else keeps the generic form, with a warning.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("cfm_plugins.hydragnn")

#: what the form recognises: HydraGNN's class, in HydraGNN's modules (mace-torch's own blocks have
# the seam)
BLOCK_CLASSES = ("RealAgnosticAttResidualInteractionBlock",)
#: the block's submodules the fused forward calls
SUBMODULES = (
    "skip_linear",
    "linear_up",
    "linear_down",
    "conv_tp_weights",
    "conv_tp",
    "linear",
    "reshape",
)
#: plain attributes carried over (the irreps HydraGNN and the check read)
ATTRIBUTES = (
    "avg_num_neighbors",
    "node_attrs_irreps",
    "node_feats_irreps",
    "edge_attrs_irreps",
    "edge_feats_irreps",
    "target_irreps",
    "hidden_irreps",
    "irreps_out",
    "node_feats_down_irreps",
    "radial_MLP",
)


class FusedInteractionBlock(torch.nn.Module):
    """HydraGNN's MACE interaction block, sharing the stock block's modules, with the product and
    the scatter fused. ``forward(node_feats, node_attrs, edge_attrs, edge_feats, edge_index)`` ->
    ``(messages [nodes, channels, (lmax + 1)**2], skip connection)``, as the stock block.

    The same submodules, parameters and attributes as the stock block (the state_dict is
    unchanged); ``conv_tp`` is a :class:`~cfm_plugins.ops.FusedConvTP` called with the edge index.
    Its ``forward`` is ours, written from the block's interface and what it computes (a skip
    connection, the up/down linears, the per-edge weights from the edge features and both ends'
    down-projected features, the product summed into receivers, the output linear over
    ``avg_num_neighbors``, the reshape). Since it re-states HydraGNN's forward, :func:`form`
    checks, once per block class, that it gives the stock block's outputs on a small random
    graph; a block that does not keeps the generic form (the product alone fused), with a
    warning."""

    def __init__(self, block: torch.nn.Module):
        from cfm_plugins.api import FusedConvTP

        super().__init__()
        for name, module in block._modules.items():
            self.add_module(name, module)
        for name, param in block._parameters.items():
            self.register_parameter(name, param)
        for name, buf in block._buffers.items():
            self.register_buffer(
                name, buf, persistent=name not in block._non_persistent_buffers_set
            )
        for name in ATTRIBUTES:
            if hasattr(block, name):
                setattr(self, name, getattr(block, name))
        fused = FusedConvTP.from_e3nn(block.conv_tp)  # ValueError for a product it cannot fuse
        fused.train(block.conv_tp.training)
        self.conv_tp = fused
        self.__dict__["_stock"] = block  # not a submodule: state_dict keys stay the block's
        self.train(block.training)

    def forward(
        self,
        node_feats: torch.Tensor,
        node_attrs: torch.Tensor,
        edge_attrs: torch.Tensor,
        edge_feats: torch.Tensor,
        edge_index: torch.Tensor,
    ):
        sender, receiver = edge_index[0], edge_index[1]
        sc = self.skip_linear(node_feats)
        up = self.linear_up(node_feats)
        down = self.linear_down(node_feats)
        tp_weights = self.conv_tp_weights(
            torch.cat([edge_feats, down[sender], down[receiver]], dim=-1)
        )
        message = self.conv_tp(up, edge_attrs, tp_weights, edge_index)  # summed into the receivers
        message = self.linear(message) / self.avg_num_neighbors
        return self.reshape(message), sc

    def to_stock(self) -> torch.nn.Module:
        """The stock block, holding this module's current (shared) state."""
        block = self.__dict__["_stock"]
        for name, module in self._modules.items():
            block._modules[name] = module.to_e3nn() if name == "conv_tp" else module
        block._parameters.update(self._parameters)
        block._buffers.update(self._buffers)
        block.train(self.training)
        return block

    def extra_repr(self) -> str:
        return f"HydraGNN {type(self.__dict__['_stock']).__name__}, conv_tp and scatter fused"


def _is_block(module) -> bool:
    from cfm_plugins.api import is_uvu_conv_tp

    cls = type(module)
    return (
        cls.__name__ in BLOCK_CLASSES
        and cls.__module__.startswith("hydragnn.")
        and all(hasattr(module, name) for name in SUBMODULES)
        and is_uvu_conv_tp(module.conv_tp)
    )


_CHECKED: dict[type, bool] = {}


def random_inputs(block: torch.nn.Module, nodes: int = 4, seed: int = 0):
    """Inputs of the block's forward for a small complete graph (one-hot node attributes), in the
    block's dtype and on its device."""
    p = next(block.parameters())
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(
            device=p.device, dtype=p.dtype
        )

    i, j = torch.meshgrid(torch.arange(nodes), torch.arange(nodes), indexing="ij")
    edge_index = torch.stack([i[i != j], j[i != j]]).to(p.device)
    edges = edge_index.shape[1]
    num_elements = block.node_attrs_irreps.dim
    elements = torch.randint(0, num_elements, (nodes,), generator=g)
    node_attrs = torch.nn.functional.one_hot(elements, num_elements).to(
        device=p.device, dtype=p.dtype
    )
    return (
        rand(nodes, block.node_feats_irreps.dim),
        node_attrs,
        rand(edges, block.edge_attrs_irreps.dim),
        rand(edges, block.edge_feats_irreps.dim),
        edge_index,
    )


def computes_as_stock(block: torch.nn.Module) -> bool:
    """Whether :class:`FusedInteractionBlock` gives ``block``'s outputs (checked once per class, on
    :func:`random_inputs`, to round-off of the block's dtype)."""
    cls = type(block)
    if cls not in _CHECKED:
        try:
            fused = FusedInteractionBlock(block)
            args = random_inputs(block)
            with torch.no_grad():
                want, got = block(*args), fused(*args)
            tol = 1e-10 if args[0].dtype == torch.float64 else 1e-4
            same = len(want) == len(got) and all(
                w.shape == o.shape
                and torch.allclose(o, w, rtol=tol, atol=tol * max(1.0, float(w.abs().max())))
                for w, o in zip(want, got)
            )
        except Exception as exc:  # noqa: BLE001 - any failure means: do not use the fused forward
            log.warning(
                "HydraGNN's %s: the fused block could not be checked (%s: %s); its conv_tp is "
                "fused alone",
                cls.__name__,
                type(exc).__name__,
                exc,
            )
            same = False
        else:
            if not same:
                log.warning(
                    "HydraGNN's %s computes something the fused block does not (another HydraGNN "
                    "version?): its conv_tp is fused alone, the scatter stays HydraGNN's",
                    cls.__name__,
                )
        _CHECKED[cls] = same
    return _CHECKED[cls]


def form():
    """The kernel table's form for HydraGNN's MACE interaction block (kernel ``conv_tp``)."""
    from cfm_plugins.api import Form

    return Form(
        "HydraGNN MACE interaction block (conv_tp + scatter)",
        recognise=lambda m, parent, attr: _is_block(m) and computes_as_stock(m),
        make=lambda m, parent, attr: FusedInteractionBlock(m),
        is_fused=lambda m, parent, attr: isinstance(m, FusedInteractionBlock),
        restore=lambda fused, parent, attr: setattr(parent, attr, fused.to_stock()),
    )


def register_form() -> None:
    """Put :func:`form` first in the ``conv_tp`` kernel's forms (idempotent)."""
    from cfm_plugins.api import add_form

    add_form("conv_tp", form())
