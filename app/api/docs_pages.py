"""Swagger UI (``/docs``) and ReDoc (``/redoc``) served from packaged assets, not a CDN.

FastAPI's own pages load their JavaScript and CSS from a CDN (and ReDoc its fonts from
Google Fonts), so on an offline or air-gapped network they render blank. The dist files
come from the ``fastapi-offline`` package (a dependency, so they ship with every install);
only its ``static`` directory is used, and the pages are FastAPI's own
``get_swagger_ui_html``/``get_redoc_html`` pointed at local URLs.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

#: Where the Swagger UI and ReDoc bundles are mounted (no token needed, like ``/docs``).
ASSETS_URL = "/docs-assets"
#: The files the pages load from :data:`ASSETS_URL`; the packaging tests check each exists.
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
#: Both pages may load only from this origin. ReDoc's bundle shows a logo fetched from its
#: vendor's CDN on every load (unconditionally, in the sidebar's "API docs by Redocly"
#: link); the policy stops that request in the browser and the image hides itself on the
#: error. Inline script and style: the pages' start-up script is inline (FastAPI's
#: template), and both bundles inject styles. ``blob:`` workers: ReDoc's search index.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'; frame-ancestors 'self'"
)


def assets_dir() -> Path:
    """The installed directory holding :data:`ASSET_FILES` (inside ``fastapi_offline``).

    Raises:
        FileNotFoundError: when the installed package lacks one of the files (a broken or
            incompatible ``fastapi-offline``), so start-up fails instead of a blank page.
    """
    directory = Path(str(files("fastapi_offline") / "static"))
    missing = [name for name in ASSET_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"fastapi-offline lacks {missing} in {directory}")
    return directory


def _local_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


def install(app: FastAPI) -> None:
    """Add ``/docs``, its OAuth2 redirect page, ``/redoc`` and the asset mount to ``app``.

    ``app`` must be built with ``docs_url=None, redoc_url=None`` so FastAPI's CDN pages are
    not registered first. URLs are prefixed with the request's ``root_path`` so the pages
    work behind a proxy that mounts the API under a path.
    """
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _local_only(
            get_swagger_ui_html(
                openapi_url=f"{root}{openapi_url}",
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=f"{root}{redirect_url}",
                swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                # Swagger UI's default validator badge calls an outside service on every load.
                swagger_ui_parameters={"validatorUrl": None, **(app.swagger_ui_parameters or {})},
            )
        )

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _local_only(
            get_redoc_html(
                openapi_url=f"{root}{openapi_url}",
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                # Google Fonts is a CDN too; ReDoc falls back to the system's sans-serif.
                with_google_fonts=False,
            )
        )
