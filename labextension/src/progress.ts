/**
 * Progress lines in a notebook job's log (`##gpusched-progress {json}`, written by
 * `jupyter_gpusched.node.nbrun`): the log view shows them as one status line, not as raw text.
 */

export const PROGRESS_MARK = '##gpusched-progress ';

export interface Progress {
  cell?: number;
  of?: number;
  index?: number;
  source?: string;
  stopping?: string;
}

export interface LogSplit {
  /** Text to show as log (everything but progress lines). */
  text: string;
  /** The last progress line of the chunk, if any. */
  progress: Progress | null;
  /** An unfinished line that may yet become a progress line: held for the next chunk. */
  rest: string;
}

function parse(line: string): Progress | null {
  try {
    const detail = JSON.parse(line.slice(PROGRESS_MARK.length));
    return detail && typeof detail === 'object' && !Array.isArray(detail) ? detail : null;
  } catch {
    return null;
  }
}

/**
 * Split a log chunk (after `held`, the rest of the previous chunk) into log text and progress.
 * A progress line always starts a line (nbrun writes a newline before it when needed); a
 * garbled one stays in the log as text.
 */
export function splitLog(held: string, chunk: string): LogSplit {
  const all = held + chunk;
  const lines = all.split('\n');
  let rest = lines.pop() ?? '';
  // Show an unfinished line at once unless it may still turn into a progress line.
  const maybeMark = PROGRESS_MARK.startsWith(rest) || rest.startsWith(PROGRESS_MARK);
  let text = '';
  let progress: Progress | null = null;
  for (const line of lines) {
    const detail = line.startsWith(PROGRESS_MARK) ? parse(line) : null;
    if (detail) {
      progress = detail;
    } else {
      text += line + '\n';
    }
  }
  if (rest && !maybeMark) {
    text += rest;
    rest = '';
  }
  return { text, progress, rest };
}

/** One human line for the header of the log view. */
export function progressText(p: Progress): string {
  if (p.stopping) {
    return `stopping: ${p.stopping}`;
  }
  const where = p.cell !== undefined && p.of !== undefined ? `cell ${p.cell} of ${p.of}` : 'cell';
  return p.source ? `${where}: ${p.source}` : where;
}
