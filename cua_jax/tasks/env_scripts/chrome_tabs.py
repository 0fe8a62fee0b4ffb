import json
import time
import urllib.error
import urllib.parse
import urllib.request


def call(port, path, method="GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def endpoint(wait):
    deadline = time.monotonic() + wait
    while True:
        for port in (9222, 1337):
            try:
                call(port, "/json/version")
                return port
            except (OSError, ValueError):
                pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(1.0)


def pages(port):
    return [target for target in call(port, "/json/list") if target.get("type") == "page"]


def norm(url):
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.lower()
    host = host[4:] if host.startswith("www.") else host
    return (parts.scheme.lower(), host, parts.path.rstrip("/"), parts.query)


def main(args):
    port = endpoint(args["wait"])
    if port is None:
        print(json.dumps({"error": "no Chromium remote-debugging endpoint answers on localhost:9222 or :1337"}))
        return
    if args["action"] == "open":
        before = pages(port)
        for index, url in enumerate(args["urls"]):
            path = "/json/new?" + urllib.parse.quote(url, safe="")
            try:
                call(port, path, "PUT")
            except urllib.error.HTTPError:
                call(port, path)  # Chromium before 111 takes GET
            if index == 0 and before:
                call(port, "/json/close/" + before[0]["id"])
        print(json.dumps({"opened": args["urls"]}))
        return
    closed = []
    for url in args["urls"]:
        for page in pages(port):
            if norm(page.get("url", "")) == norm(url):
                call(port, "/json/close/" + page["id"])
                closed.append(url)
                break
    print(json.dumps({"closed": closed}))
