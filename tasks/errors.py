"""Errors raised by the task loaders."""


class MissingDataError(Exception):
  """A dataset a task needs is not on this machine.

  The message is one line naming the missing dataset and how to get it.
  """
