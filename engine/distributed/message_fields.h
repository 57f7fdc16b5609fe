// Internal to dist/ (messages.cc): the per-type field layouts behind EncodeFrame and
// DecodePayload. For each message struct T: Check(T) records what the encoder refuses to send,
// Put(T) writes the fields in wire order, Get(T) reads them back applying the same checks (so
// anything the decoder accepts, the encoder accepts too). Pure functions; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/distributed/messages.h"
#include "engine/distributed/wire.h"

namespace specd::dist_internal {

// Hello/HelloAck layouts are frozen but may grow in later versions; this bounds what we read.
inline constexpr uint64_t kMaxHandshakePayloadBytes = 4096;

// Records that `text` is longer than kMaxTextBytes, naming `field` (the layouts' text check).
void CheckText(const std::string& text, const char* field, FieldErrors* e);
// Records the first id outside [0, vocab_size) (any non-negative id when vocab_size is 0).
void CheckTokenIds(std::span<const int32_t> ids, const WireLimits& limits, const char* field,
                   FieldErrors* e);

void Check(const Hello& m, const WireLimits& limits, FieldErrors* e);
void Put(const Hello& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, Hello* m);

void Check(const HelloAck& m, const WireLimits& limits, FieldErrors* e);
void Put(const HelloAck& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, HelloAck* m);

void Check(const HelloAuth& m, const WireLimits& limits, FieldErrors* e);
void Put(const HelloAuth& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, HelloAuth* m);

void Check(const SpeculateRequest& m, const WireLimits& limits, FieldErrors* e);
void Put(const SpeculateRequest& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, SpeculateRequest* m);

void Check(const SpeculateResponse& m, const WireLimits& limits, FieldErrors* e);
void Put(const SpeculateResponse& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, SpeculateResponse* m);

void Check(const Release& m, const WireLimits& limits, FieldErrors* e);
void Put(const Release& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, Release* m);

void Check(const Heartbeat& m, const WireLimits& limits, FieldErrors* e);
void Put(const Heartbeat& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, Heartbeat* m);

void Check(const Shutdown& m, const WireLimits& limits, FieldErrors* e);
void Put(const Shutdown& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, Shutdown* m);

void Check(const BulkLinkInit& m, const WireLimits& limits, FieldErrors* e);
void Put(const BulkLinkInit& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, BulkLinkInit* m);

// tp_message_fields.cc: the tensor-parallel control link.
void Check(const TpInit& m, const WireLimits& limits, FieldErrors* e);
void Put(const TpInit& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, TpInit* m);

void Check(const TpReady& m, const WireLimits& limits, FieldErrors* e);
void Put(const TpReady& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, TpReady* m);

void Check(const TpStep& m, const WireLimits& limits, FieldErrors* e);
void Put(const TpStep& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, TpStep* m);
void Check(const TpJoin& m, const WireLimits& limits, FieldErrors* e);
void Put(const TpJoin& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, TpJoin* m);
uint64_t MaxTpPayloadBytes(MessageType type, const WireLimits& limits);

// ssd_message_fields.cc: the SSD link's init exchange and its cache offers.
void Check(const SsdInit& m, const WireLimits& limits, FieldErrors* e);
void Put(const SsdInit& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, SsdInit* m);

void Check(const SsdReady& m, const WireLimits& limits, FieldErrors* e);
void Put(const SsdReady& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, SsdReady* m);

void Check(const CacheOffer& m, const WireLimits& limits, FieldErrors* e);
void Put(const CacheOffer& m, const WireLimits& limits, ByteWriter& w);
void Get(ByteReader& r, const WireLimits& limits, CacheOffer* m);
// SsdInit's, SsdReady's (fixed: bounded texts and numbers) and CacheOffer's largest payloads.
uint64_t MaxSsdInitPayloadBytes(MessageType type, const WireLimits& limits);

// Largest payload of `type` under `limits`, in bytes.
uint64_t MaxPayloadBytesOf(MessageType type, const WireLimits& limits);

}  // namespace specd::dist_internal
