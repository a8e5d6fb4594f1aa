"""The aiohttp applications: rank 0's full API, and the dummy health server of node ranks >= 1."""

from __future__ import annotations

import secrets

from aiohttp import web
from dspark_ci.sglang_sim import native_api, openai_api
from dspark_ci.sglang_sim.prometheus import ServerMetrics
from dspark_ci.sglang_sim.server_state import ServerState, json_response

# (methods, path, handler); generation endpoints are 503 until the server is up
ROUTES = (
    (("GET",), "/health", native_api.health),
    (("GET",), "/health_generate", native_api.health),
    (("GET",), "/ready", native_api.health),
    (("GET",), "/model_info", native_api.model_info),
    (("GET",), "/get_model_info", native_api.get_model_info),
    (("GET",), "/server_info", native_api.server_info),
    (("GET",), "/get_server_info", native_api.get_server_info),
    (("GET",), "/v1/models", native_api.models),
    (("GET", "POST"), "/flush_cache", native_api.flush_cache),
    (("POST",), "/v1/chat/completions", native_api.not_ready(openai_api.chat_completions)),
    (("POST",), "/v1/completions", native_api.not_ready(openai_api.completions)),
    (("POST", "PUT"), "/generate", native_api.not_ready(native_api.generate)),
)
METRICS_ROUTE = (("GET",), "/metrics", native_api.metrics)
# SGLang lets probes and scrapers through without a key (utils/auth.py)
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def _api_key_middleware(api_key: str):
    @web.middleware
    async def check(request: web.Request, handler):
        if request.method == "OPTIONS" or request.path.startswith(OPEN_PREFIXES):
            return await handler(request)
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token, api_key):
            return json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)
    return check


def _http_metrics_middleware(metrics: ServerMetrics):
    """SGLang's add_http_request_metrics_middleware: every request counted by its route's path (the raw path when
    no route matches), the active ones gauged, each response counted by its status (an aborted one is not)."""
    @web.middleware
    async def count(request: web.Request, handler):
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else request.path
        metrics.http_started(endpoint, request.method)
        status = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as err:
            status = err.status
            raise
        finally:
            metrics.http_finished(endpoint, request.method, status)
    return count


def api_app(state: ServerState, extra_middlewares: list | None = None) -> web.Application:
    middlewares = [_http_metrics_middleware(state.metrics)] if state.metrics is not None else []
    middlewares += extra_middlewares or []  # e.g. PD disaggregation's transfer (dspark_ci.sglang_sim.disaggregation)
    middlewares += [_api_key_middleware(state.args.api_key)] if state.args.api_key else []
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
    app[ServerState.KEY] = state
    routes = ROUTES + ((METRICS_ROUTE,) if state.args.enable_metrics else ())
    for methods, path, handler in routes:
        for method in methods:
            app.router.add_route(method, path, handler)
    return app


async def _always_healthy(request: web.Request) -> web.Response:
    return web.Response(status=200)


def shard_peer_app(state: ServerState) -> web.Application:
    """What a shard answers its siblings on its peer socket: its own ranks' states and /metrics
    (dspark_ci.sglang_sim.engine_shards)."""
    app = web.Application()
    app[ServerState.KEY] = state
    app.router.add_get(native_api.SHARD_STATES_PATH, native_api.shard_states)
    app.router.add_get(native_api.SHARD_METRICS_PATH, native_api.shard_metrics)
    return app


def dummy_health_app() -> web.Application:
    """What SGLang's node ranks >= 1 serve: a /health that always says 200, proving nothing."""
    app = web.Application()
    app.router.add_get("/health", _always_healthy)
    app.router.add_get("/health_generate", _always_healthy)
    return app
