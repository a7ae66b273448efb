"""The Jupyter server extension: notebooks are saved with our static text where our buttons were
(``live_views``). Enabled by the ``jupyter_server_config.d/nb_cudaguard.json`` that the package
installs into ``{sys.prefix}/etc/jupyter``; so it works where nb_cudaguard is installed in the
environment that runs the Jupyter server (``jupyter server extension list`` shows it)."""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nb_cudaguard.server_extension"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .live_views import pre_save_hook

    contents = serverapp.contents_manager
    register = getattr(contents, "register_pre_save_hook", None)
    if register is None:  # jupyter_server < 2 has one hook only: the user's, left alone
        serverapp.log.info("nb_cudaguard: this Jupyter server has no register_pre_save_hook")
        return
    register(pre_save_hook)
