"""``overnight ui``: a dashboard in the browser, server-rendered from one query layer.

* :mod:`overnight.web.queries` -- one function per page, returning JSON-ready data (read
  through :mod:`overnight.api` and the verify layer; nothing writes);
* :mod:`overnight.web.app` -- the Starlette app: each page is a template over that data, and
  ``PAGE.json`` is the data itself; actions are CSRF-checked POSTs; token and Host checks;
* :mod:`overnight.web.svg` -- the branch graph and growth chart as server-rendered SVG;
* :mod:`overnight.web.server` -- ``overnight ui``: bind rules, token, uvicorn.

Assets (``static/``: htmx 2.0.11 from the npm package ``htmx.org``, 0BSD licence in
``static/htmx.LICENSE.txt``, and one stylesheet) ship inside the package: no CDN, no network.
Needs the ``ui`` extra (starlette, jinja2, uvicorn, python-multipart).
"""

from overnight.web.app import create_app

__all__ = ["create_app"]
