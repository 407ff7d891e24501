package redlimit

// Funnel returns the limiter called name (after the Client's prefix) as a
// leaky bucket computed with GCRA, as redis-cell's CL.THROTTLE does: Burst
// permits (0: Rate) fit in the funnel, which drains Rate permits per Interval,
// one every Interval/Rate. Grants are spread evenly once the burst is spent.
// Its state is one integer in one key, which expires when the funnel is empty.
func (c *Client) Funnel(name string) *Limiter { return c.limiter(name, funnel) }

var funnel = algorithm{script: newScript("funnel.lua"), state: []string{"tat"}}
