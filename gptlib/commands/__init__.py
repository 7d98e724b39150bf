"""The command lines, kept out of the library: ``python -m gptlib.train`` (:mod:`.train`) and
``python -m gptlib.generate`` (:mod:`.generate`), with the option helpers they share
(:mod:`.options`). Their options come from the configuration dataclasses' fields, help text
included (:func:`gptlib.config.option`).
"""
