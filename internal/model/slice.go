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
	// Endpoints carry no port: the tracker gives each one the port of every
	// EndpointPort that matches a ServicePort.
	Endpoints []Endpoint
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, zero when absent.
	TriggerTime time.Time
}
