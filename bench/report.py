"""Plain-text tables of benchmark rows, and their CSV/JSON files."""

import csv
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

# A column: (row key, header, format spec).
Column = tuple[str, str, str]


def format_table(title: str, rows: Sequence[Mapping[str, Any]],
                 columns: Sequence[Column]) -> str:
  """`rows` as an aligned text table under `title`; missing cells are blank."""
  cells = [[header for _, header, _ in columns]]
  for row in rows:
    cells.append([
        format(row[key], spec) if key in row else ''
        for key, _, spec in columns
    ])
  widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
  lines = [title, '-' * len(title)]
  for line in cells:
    lines.append('  '.join(c.rjust(w) for c, w in zip(line, widths)))
  return '\n'.join(lines)


def check_output_path(path: str) -> None:
  """Raises ValueError unless `path` ends in `.json` or `.csv`."""
  if os.path.splitext(path)[1].lower() not in ('.json', '.csv'):
    raise ValueError(f'--output must end in .json or .csv, got {path!r}.')


def write_tables(path: str,
                 tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
  """Writes `{table name: rows}` to `path`, as JSON or CSV by its extension.

  JSON: the mapping itself. CSV: one line per table cell, columns `table`,
  `row`, `field`, `value` (a long format that holds tables of any shape).

  Raises:
    ValueError: If `path` ends neither in `.json` nor `.csv`.
  """
  check_output_path(path)
  extension = os.path.splitext(path)[1].lower()
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(path, 'w', newline='') as f:
    if extension == '.json':
      json.dump(tables, f, indent=2)
      return
    writer = csv.writer(f)
    writer.writerow(['table', 'row', 'field', 'value'])
    for name, rows in tables.items():
      for index, row in enumerate(rows):
        for field, value in row.items():
          writer.writerow([name, index, field, value])
