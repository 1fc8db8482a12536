"""A download mirror on 127.0.0.1 for the download tests: serves a directory
with HTTP ranges, and can cut a response short or send it slowly."""

import contextlib
import functools
import http.server
import os
import pathlib
import threading
import time
from collections.abc import Iterator


class Handler(http.server.SimpleHTTPRequestHandler):
  """Serves files with ranges; records `(path, Range header)` per request."""

  cut_after = None  # bytes of a response body, then the connection drops
  delay = 0.0  # seconds per 4 KiB
  requests = []

  def log_message(self, *args):
    pass

  def do_GET(self):
    path = self.translate_path(self.path)
    if not os.path.isfile(path):
      self.send_error(404)
      return
    with open(path, 'rb') as f:
      body = f.read()
    start = 0
    range_header = self.headers.get('Range')
    type(self).requests.append((self.path, range_header))
    if range_header:
      start = int(range_header.split('=')[1].split('-')[0])
      if start >= len(body):
        self.send_error(416)
        return
      self.send_response(206)
      self.send_header('Content-Range',
                       f'bytes {start}-{len(body) - 1}/{len(body)}')
    else:
      self.send_response(200)
    self.send_header('Content-Length', str(len(body) - start))
    self.end_headers()
    body = body[start:]
    if self.cut_after is not None:
      body = body[:self.cut_after]
    for i in range(0, len(body), 4096):
      self.wfile.write(body[i:i + 4096])
      if self.delay:
        time.sleep(self.delay)
    self.wfile.flush()


@contextlib.contextmanager
def serve(directory: pathlib.Path) -> Iterator[tuple[str, type[Handler]]]:
  """Serves `directory` on a free loopback port: yields `(base URL, handler
  class)`; set the class's `cut_after`/`delay`, read its `requests`."""
  handler = type('MirrorHandler', (Handler,), {'requests': []})
  server = http.server.ThreadingHTTPServer(
      ('127.0.0.1', 0), functools.partial(handler, directory=str(directory)))
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f'http://127.0.0.1:{server.server_address[1]}', handler
  finally:
    server.shutdown()
    server.server_close()
