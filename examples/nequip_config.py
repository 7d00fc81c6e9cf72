"""Write a nequip-train (NequIP 0.19) config for the example CuNi set (examples/make_dataset.py).

    python examples/nequip_config.py --train DIR/train.xyz --valid DIR/valid.xyz --out cfg.yaml \
        [--epochs 2] [--features 16] [--l-max 1] [--layers 2] [--batch-size 4] [--fused] [--cfm
        mace,...]

``--fused`` writes the config form of the fused kernel (the ``enable_CFMFused`` model modifier);
``--cfm NAMES`` adds a ``cfm_plugins:`` key that enables plugins when run under ``cfm-run``.
Run it with ``nequip-train -cp DIR -cn NAME hydra.run.dir=OUT``. The config is
:mod:`cfm_plugins.datasets.nequip_config`'s (``nequip_config``/``write_config`` from Python).
"""

from __future__ import annotations

import argparse
import sys

from cfm_plugins.datasets.nequip_config import write_config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--valid", required=True)
    p.add_argument("--test")
    p.add_argument("--out", required=True, help="the YAML file to write")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--l-max", type=int, default=1)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument(
        "--fused", action="store_true", help="config form of the fused kernel (enable_CFMFused)"
    )
    p.add_argument("--cfm", help="comma-separated plugins for a cfm_plugins: key")
    a = p.parse_args(argv)
    write_config(
        a.out,
        train=a.train,
        valid=a.valid,
        test=a.test,
        epochs=a.epochs,
        features=a.features,
        l_max=a.l_max,
        layers=a.layers,
        batch_size=a.batch_size,
        fused=a.fused,
        cfm_plugins={"enable": a.cfm.split(",")} if a.cfm else None,
    )
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
