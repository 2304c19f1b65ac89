/**
 * Notifications outside the tab (issue 39), from JupyterLab: "your GPU is ready", "your job
 * ended", "your booking starts", ... as the browser's own notifications (Web Notifications API)
 * and as JupyterLab toasts.
 *
 * The events come from the hub's gpu-pool service's feed, which gives each one once, through this
 * server (GET gpuhub/notifications, gpuhub_activity/notify.py): this code never talks to the hub.
 * One poller per browser, not one per tab: the tab that holds the Web Lock LOCK polls, the others
 * wait for it (and one takes over when its tab closes).  The pool page's own poller takes the same
 * lock (same origin), so a pool page and JupyterLab tabs together still ask once.
 *
 * It polls only where the person allowed notifications for the hub's site (the permission is
 * asked once, from a toast's button: browsers grant it only on a click).
 */
import { Notification as LabNotification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The Web Lock every poller of this hub takes (the pool page's too: poolpage/templates/_notify.html). */
export const LOCK = 'gpuhub-notifications';
const ASKED_KEY = 'gpuhub-notifications-asked';
const DEFAULT_EVERY_S = 5;
const MAX_EVERY_S = 300;
const FLOOD = 3; // more events than this in one answer: two of them, and one for the rest

export interface IFeedEvent {
  id: number | string;
  event: string;
  title: string;
  body: string;
  url: string | null;
}

/** A link of the feed, opened on the hub this page came from (the feed's origin is the service's view). */
function sameOrigin(url: string | null): string | null {
  if (!url) {
    return null;
  }
  try {
    const parsed = new URL(url, window.location.href);
    return window.location.origin + parsed.pathname + parsed.search + parsed.hash;
  } catch (e) {
    return null;
  }
}

function show(e: IFeedEvent): void {
  const url = sameOrigin(e.url);
  try {
    const n = new window.Notification(e.title, { body: e.body, tag: `gpu-hub-${e.id}` });
    n.onclick = () => {
      window.focus();
      if (url) {
        window.open(url, '_blank', 'noopener');
      }
      n.close();
    };
  } catch (err) {
    // A browser that makes notifications only from a service worker: the toast below still says it.
  }
  if (e.event === 'cull-warning') {
    return; // JupyterLab already warns about a cull, with its own "Keep my server" (index.ts Warnings)
  }
  const actions = url
    ? [{ label: 'Open', callback: () => void window.open(url, '_blank', 'noopener') }]
    : [];
  LabNotification.info(e.body ? `${e.title}: ${e.body}` : e.title, { autoClose: false, actions });
}

/** What one answer shows: all of it, or (a flood) two events and one line for the rest. */
export function toShow(events: IFeedEvent[], poolUrl: string | null): IFeedEvent[] {
  if (events.length <= FLOOD) {
    return events;
  }
  return [
    ...events.slice(0, 2),
    {
      id: `more-${events[2].id}`,
      event: 'more',
      title: `${events.length - 2} more updates about your GPUs and jobs`,
      body: 'Open the GPU pool page to see them.',
      url: poolUrl
    }
  ];
}

class Poller {
  private settings = ServerConnection.makeSettings();
  private stopped = false;

  constructor(private poolUrl: () => string | null) {}

  private async once(): Promise<number> {
    const url = URLExt.join(this.settings.baseUrl, 'gpuhub', 'notifications');
    try {
      const r = await ServerConnection.makeRequest(url, { cache: 'no-store' }, this.settings);
      const answer = (await r.json()) as { events?: IFeedEvent[]; poll_after_s?: number };
      const every = Math.min(MAX_EVERY_S, Math.max(1, answer.poll_after_s ?? DEFAULT_EVERY_S));
      if (r.status === 404) {
        this.stopped = true; // off on this hub, or not a hub's server: nothing to ask
      }
      if (r.ok && answer.events?.length) {
        toShow(answer.events, this.poolUrl()).forEach(show);
      }
      return every;
    } catch (e) {
      return 30;
    }
  }

  /** Poll while this tab lives (called by the lock's holder only). */
  async run(): Promise<void> {
    while (!this.stopped) {
      const every = await this.once();
      await new Promise(resolve => window.setTimeout(resolve, every * 1000));
    }
  }
}

/** The single poller of this browser: where Web Locks exist, the tab holding LOCK; else this tab. */
function lead(poller: Poller): void {
  const locks = (navigator as Navigator & { locks?: LockManager }).locks;
  if (locks) {
    void locks.request(LOCK, () => poller.run());
  } else {
    void poller.run();
  }
}

/** Start the notifications in this tab; `poolUrl` gives the pool page's address when known. */
export function startNotifications(poolUrl: () => string | null): void {
  if (!('Notification' in window)) {
    return;
  }
  const poller = new Poller(poolUrl);
  const permission = window.Notification.permission;
  if (permission === 'granted') {
    lead(poller);
    return;
  }
  if (permission === 'denied' || window.localStorage.getItem(ASKED_KEY)) {
    return; // blocked, or asked once already in this browser: the pool page's button asks again
  }
  const id = LabNotification.info(
    'The GPU hub can tell you when your GPU is ready, a job ends or a server is about to be culled, ' +
      'in this browser while a hub tab is open.',
    {
      autoClose: false,
      actions: [
        {
          label: 'Notify me in this browser',
          displayType: 'accent',
          callback: () => {
            window.localStorage.setItem(ASKED_KEY, '1');
            void window.Notification.requestPermission().then(p => {
              if (p === 'granted') {
                lead(poller);
              }
            });
          }
        },
        {
          label: 'Not now',
          callback: () => {
            window.localStorage.setItem(ASKED_KEY, '1');
            LabNotification.dismiss(id);
          }
        }
      ]
    }
  );
}
