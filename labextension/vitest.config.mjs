import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node',
    // Local-time formatting in the tests reads the same on every machine.
    env: { TZ: 'UTC' }
  }
});
