package redlimitotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/redlimit/redlimit"
)

// The instruments of a Client's degraded mode (redlimit.WithDegraded).
const (
	DegradedInstancesName = "redlimit.degraded.instances" // gauge: the instances the heartbeats counted (InstancesKey)
	DegradedActiveName    = "redlimit.degraded.active"    // gauge: 1 while this instance decides locally, else 0
)

// InstancesKey says which count a DegradedInstancesName value is: all, the
// instances live (an Overall limit's divisor), or same_id, those of them
// with this Client's id (a PerClient limit's).
const InstancesKey = attribute.Key("redlimit.instances")

// DegradedMetrics registers what client's degraded mode knows
// (Client.DegradedState), read at each collection from memory: how many
// instances its heartbeats counted live (DegradedInstancesName, by
// InstancesKey: a limit is shared among that many while Redis is down,
// or Degraded.MinInstances if more), and whether it decides locally now
// (DegradedActiveName: from the first decision it made locally until Redis
// decides one again). Its local decisions themselves are counted by the
// Client's Observer, with reason degraded. A Client without WithDegraded
// reports nothing. A nil provider is the global one.
func DegradedMetrics(provider metric.MeterProvider, client *redlimit.Client) (metric.Registration, error) {
	meter, _ := meterOf(provider, nil)
	instances, err1 := meter.Int64ObservableGauge(DegradedInstancesName,
		metric.WithDescription("Instances redlimit's degraded mode counted live by their heartbeats: the share's divisor while Redis is down."),
		metric.WithUnit("{instance}"))
	active, err2 := meter.Int64ObservableGauge(DegradedActiveName,
		metric.WithDescription("1 while redlimit decides locally, within this instance's share, what Redis could not; else 0."),
		metric.WithUnit("1"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := client.DegradedState()
		if !s.Enabled {
			return nil
		}
		o.ObserveInt64(instances, int64(s.Instances), metric.WithAttributes(InstancesKey.String("all")))
		o.ObserveInt64(instances, int64(s.SameID), metric.WithAttributes(InstancesKey.String("same_id")))
		var on int64
		if s.Active {
			on = 1
		}
		o.ObserveInt64(active, on)
		return nil
	}, instances, active)
}
