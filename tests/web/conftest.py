def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: drives the web page in headless Chromium (skipped without /usr/bin/chromium)")
