import base64
import json
import urllib.request

request = urllib.request.Request("http://127.0.0.1:8080/requests/status.xml")
request.add_header("Authorization", "Basic " + base64.b64encode(b":password").decode())
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        print(json.dumps({"b64": base64.b64encode(response.read()).decode()}))
except OSError as error:
    print(json.dumps({"error": str(error)}))
