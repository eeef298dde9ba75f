"""Real Python clients through proxynet, for tests/tests/e2e/clients.rs.

Environment: PROXY_HTTP (http://user:pass@host:port), PROXY_SOCKS
(socks5h://user:pass@host:port), PROXY_HTTPS (https://user:pass@127.0.0.1:port),
PROXY_CA (the HTTPS proxy's CA file), TARGET (http URL of the whoami target).
Prints one JSON object: case -> {"status", "peer"} (the exit's egress IP the
target saw), or {"error"}.
"""
import json
import os
import ssl
import subprocess
import sys

import httpx
import requests

target = os.environ["TARGET"]
http_proxy = os.environ["PROXY_HTTP"]
socks_proxy = os.environ["PROXY_SOCKS"]
https_proxy = os.environ["PROXY_HTTPS"]
ca = os.environ["PROXY_CA"]
results = {}


def record(name, fn):
    try:
        status, body = fn()
        results[name] = {"status": status, "peer": json.loads(body)["peer"].rsplit(":", 1)[0]}
    except Exception as e:  # the test reports what failed, whatever it was
        results[name] = {"error": f"{type(e).__name__}: {e}"}


def requests_get(proxies, **kw):
    r = requests.get(target, proxies=proxies, timeout=20, **kw)
    return r.status_code, r.text


def httpx_get(proxy, **kw):
    with httpx.Client(proxy=proxy, timeout=20, **kw) as c:
        r = c.get(target)
        return r.status_code, r.text


def env_proxies(tool):
    """The HTTP_PROXY environment variable, read by the library itself."""
    code = (
        "import json,os,sys\n"
        + ("import requests\nr=requests.get(os.environ['TARGET'],timeout=20)\n" if tool == "requests"
           else "import httpx\nr=httpx.get(os.environ['TARGET'],timeout=20)\n")
        + "print(r.status_code); print(r.text)"
    )
    env = dict(os.environ, HTTP_PROXY=http_proxy, http_proxy=http_proxy, NO_PROXY="", no_proxy="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-300:])
    status, body = out.stdout.split("\n", 1)
    return int(status), body


record("requests_http_proxy", lambda: requests_get({"http": http_proxy, "https": http_proxy}))
record("requests_socks5h", lambda: requests_get({"http": socks_proxy, "https": socks_proxy}))
record("requests_env_proxy", lambda: env_proxies("requests"))
record("requests_https_proxy", lambda: requests_get({"http": https_proxy, "https": https_proxy}, verify=ca))
record("httpx_http_proxy", lambda: httpx_get(http_proxy))
record("httpx_socks5", lambda: httpx_get(socks_proxy.replace("socks5h://", "socks5://")))
record("httpx_env_proxy", lambda: env_proxies("httpx"))
record("httpx_https_proxy", lambda: httpx_get(httpx.Proxy(https_proxy, ssl_context=ssl.create_default_context(cafile=ca))))
print(json.dumps(results))
