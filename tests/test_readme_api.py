"""The README's Python API block runs as written (doctest): the documented API is the real one."""
import doctest
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_block():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no ```python block"
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for i, text in enumerate(blocks):
        runner.run(parser.get_doctest(text, {}, f"README block {i}", str(README), 0))
    failed, tried = runner.summarize(verbose=False)
    assert tried > 0 and failed == 0


@pytest.mark.parametrize("module", ["trainfit", "trainfit.api"])
def test_module_doctests(module):
    import importlib

    failed, tried = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failed == 0


def test_help_lists_the_api():
    import trainfit

    assert {"estimate", "trace_module", "measure_step", "compare", "Setup", "SETTINGS"} <= set(trainfit.__all__)
    assert "estimate(model" in trainfit.__doc__
