import { afterEach, describe, expect, it, vi } from 'vitest';
import { EventStream, GpuschedApiError, GpuschedClient, StreamStatus } from '../src/api';

/** A websocket the server refuses: it closes without ever opening. */
class RefusedSocket {
  onopen: (() => void) | null = null;
  onmessage: (() => void) | null = null;
  onclose: (() => void) | null = null;

  constructor(readonly url: string) {
    setTimeout(() => this.onclose?.(), 0);
  }

  close(): void {
    // nothing to close
  }
}

afterEach(() => {
  vi.useRealTimers();
});

describe('EventStream', () => {
  it('says why the server refused it and waits as long as it was told', async () => {
    vi.useFakeTimers();
    const why = new GpuschedApiError(
      429,
      'TooManyError',
      'alice has 16 streams open (event websockets and log follows), the limit ' +
        '(GpuSchedPolicy.limits streams) is 16: close a lab tab, a %gpu status widget or a ' +
        'log follow',
      undefined,
      10
    );
    const asked: string[] = [];
    const client = {
      settings: { WebSocket: RefusedSocket },
      eventsUrl: () => 'ws://server/gpusched/api/events',
      eventsRefusal: async () => {
        asked.push('why');
        return why;
      }
    } as unknown as GpuschedClient;
    const statuses: StreamStatus[] = [];
    const refusals: (string | null)[] = [];
    const stream = new EventStream(
      client,
      () => -1,
      () => undefined,
      status => statuses.push(status),
      refusal => refusals.push(refusal?.message ?? null)
    );
    stream.open();
    await vi.advanceTimersByTimeAsync(1);
    expect(refusals).toEqual([why.message]);
    expect(statuses).toEqual(['connecting', 'retrying']);
    await vi.advanceTimersByTimeAsync(9000); // not the usual half second: Retry-After is 10 s
    expect(statuses).toEqual(['connecting', 'retrying']);
    await vi.advanceTimersByTimeAsync(1001);
    expect(statuses).toEqual(['connecting', 'retrying', 'connecting', 'retrying']);
    expect(asked).toEqual(['why', 'why']);
    stream.close();
  });
});
