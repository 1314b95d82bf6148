// Package loadbalancer holds the CCM's decisions about Services of type LoadBalancer, one
// package a concern; this package itself holds nothing:
//
//   - ipam: which addresses a Service gets (pure), and the record of which pool gave each.
//   - pools: IPPools and BGPPeers decoded and validated once (pure).
//   - planner: which nodes announce each address (pure).
//   - desired: what each node is told, from the plan and the objects (pure).
//   - objects: the IPPools and BGPPeers the informers hold, decoded for every reader.
//   - services: the allocation controller (Services get addresses, pools get their figures).
//   - announcer: the loop that plans every change and pushes each node's part to its agent.
//   - agentclient: the CCM's connections to the agents, and their enrollment.
//   - report: how all of them report: field managers, the status writer, the pacer, and every
//     Event reason and condition type.
//
// Data flows one way: Service, then allocation, then plan, then push, then announcement.
package loadbalancer
