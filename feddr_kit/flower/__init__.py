"""The kit on Flower: the apps, and what runs them under ``flwr run``.

* :mod:`feddr_kit.flower.launch`: a :class:`~feddr_kit.Config` in a Flower run config and back, the App's
  files, ``flwr run`` in a local simulation (:func:`simulate`) or on a running SuperLink (:func:`deploy`), and
  the checks of their result files. It does not import Flower (the processes it starts do), so the command
  line checks what is installed before anything starts;
* :mod:`feddr_kit.flower.apps`: ``server_app`` and ``client_app`` over :class:`KitStrategy`, from the same code
  as ``fk.run``, and :func:`run_in_process`, the Flower code path in one process. Needs
  ``pip install 'feddr_kit[flower]'``.

``feddr_kit.flower.<name>`` gives the public names of both. The launcher's come with this face; an app's name
imports :mod:`~feddr_kit.flower.apps`, and so Flower, at its first use, so that ``python -m feddr_kit flower``
and the launcher work, and say what is missing, where Flower is not installed. ``import feddr_kit`` imports
neither. The App names its components ``feddr_kit.flower:server_app`` and ``:client_app``: Flower checks a
component by reading the module's source for the name, which finds them in ``__all__``.
"""
from .launch import (APP_DIR, FLWR_HOME_DIR, TIMING, UNSUPPORTED, check_installed, check_outcome, check_superlink,
                     check_supported, config_from_run_config, config_to_run_config, deploy, simulate, write_app,
                     write_flwr_home)

__all__ = ["APP_DIR", "FLWR_HOME_DIR", "TIMING", "UNSUPPORTED", "check_installed", "check_outcome", "check_superlink",
           "check_supported", "config_from_run_config", "config_to_run_config", "deploy", "simulate", "write_app",
           "write_flwr_home",
           # the apps' names, looked up in feddr_kit.flower.apps at first use
           "server_app", "client_app", "server_main", "client_query", "client_train", "KitStrategy", "run_on_grid",
           "run_in_process", "InProcessGrid", "provide_data", "client_setup", "to_record", "from_record",
           "pack_uploads", "unpack_uploads", "message_flow_figure", "PARTITION_ID", "GRADIENTS", "CLIENT_STATE"]


def __getattr__(name: str):
    if name in __all__:  # not yet here: one of the apps' names (the launcher's were imported above)
        from . import apps

        return getattr(apps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
