"""The kernel interface and what every layer shares: stat names, single-argument
checks, the bounded cache, helper threads. Imports no other chainrunner folder.
"""
