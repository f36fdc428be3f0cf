"""The local web UI (`trainfit serve`): FastAPI app in app.py, the page in page.py. Needs trainfit[web]."""
