package model

import "time"

// EndpointPort is one port of an EndpointSlice. Name matches the Service
// port's name; Port is the resolved target port.
type EndpointPort struct {
	Name     string
	Port     uint16
	Protocol Protocol
}

// EndpointSlice is what the proxy keeps of a discovery/v1 EndpointSlice.
type EndpointSlice struct {
	Service ServiceName
	Name    string
	Ports   []EndpointPort
	// Endpoints are in address order. The tracker gives each one the port
	// of every EndpointPort that matches a ServicePort; in a slice of one
	// port they carry it already, so that the list can be used as it is.
	Endpoints []Endpoint
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, zero when absent.
	TriggerTime time.Time
}
