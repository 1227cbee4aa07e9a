/** Byte chunks → text lines (UTF-8 safe across chunk boundaries) → SSE data fields. */

export async function* lines(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of chunks) {
    buffer += decoder.decode(chunk, { stream: true });
    let end: number;
    while ((end = buffer.indexOf("\n")) >= 0) {
      yield buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
    }
  }
  buffer += decoder.decode();
  if (buffer) yield buffer;
}

/** The `data:` payloads of a server-sent event stream. */
export async function* sseData(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<string> {
  for await (const line of lines(chunks)) {
    if (line.startsWith("data:")) yield line.slice(5).trimStart();
  }
}
