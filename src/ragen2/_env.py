"""Process environment defaults set before heavy imports: offline hubs, quiet tokenizers.

Hub downloads are off unless the environment turns them on: ``HF_HUB_OFFLINE=0`` alone does (transformers'
own ``TRANSFORMERS_OFFLINE`` follows it). wandb's mode is the config's, ``logger.wandb.offline``
(conf/logger/wandb.yaml, ``ragen2.loggers.wandb_logger``), so no ``WANDB_MODE`` is set here.
"""

import os


def set_defaults() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads at run time
    os.environ.setdefault("TRANSFORMERS_OFFLINE", os.environ["HF_HUB_OFFLINE"])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
