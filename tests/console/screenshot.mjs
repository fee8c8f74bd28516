// The README's screenshot of the console's overview (docs/console-overview.png):
// headless Chromium opens TB_URL/ui on a broker that scripts/console-screenshot
// started (no tokens, loopback) and seeded, and saves the page to TB_OUT.
//
// Run through scripts/console-screenshot, which installs nothing: it needs
// `npm ci` done in this folder and /usr/bin/chromium (or CHROMIUM).

import { chromium } from 'playwright-core';

const base = (process.env.TB_URL || '').replace(/\/+$/, '');
const out = process.env.TB_OUT;
if (!base || !out) {
  console.error('TB_URL and TB_OUT must be set');
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(`${base}/ui`);
  await page.waitForSelector('#live[data-state="open"]', { timeout: 10_000 });
  await page.waitForSelector('#overview-workers tbody tr', { timeout: 10_000 });
  // Let the relative times and the live counts settle.
  await page.waitForTimeout(1500);
  await page.screenshot({ path: out, fullPage: true });
  console.log(`saved ${out}`);
} finally {
  await browser.close();
}
