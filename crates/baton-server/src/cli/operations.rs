//! The commands that change what a model serves: `load`, `rollback`,
//! `pin`, `unpin`, `unload`, `retire`. Each prints what serves afterwards
//! and the decision the server recorded (a hold, a pin), which it keeps
//! across restarts; `--json` prints the server's answer instead.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

use super::{Target, client, render};

/// What serves `model` now and the decision in force, from its status.
fn after(target: &Target, model: &str) -> Option<Value> {
    target.client().ok()?.get_json(&format!("/baton/v1/models/{model}/status")).ok()
}

/// "ranker: version 1 serves; held at version 1 by a load until …".
fn serving_line(model: &str, status: &Value) -> String {
    let serves = match status["serving"].as_u64() {
        Some(v) => format!("version {v} serves"),
        None => "no version serves".to_owned(),
    };
    let d = &status["decision"];
    let decision = match d["kind"].as_str() {
        None => "it follows the repository's newest version".to_owned(),
        Some("pin") => {
            format!("pinned to version {} {}", render::version(&d["version"]), d["holds"].as_str().unwrap_or(""))
        }
        Some("unload") => format!("kept unloaded {}", d["holds"].as_str().unwrap_or("")),
        Some(kind) => format!(
            "held at version {} (recorded by the {kind}) {}",
            render::version(&d["version"]),
            d["holds"].as_str().unwrap_or("")
        ),
    };
    format!("{model}: {serves}; {}.", decision.trim_end())
}

/// Prints the answer as JSON with the decision in force beside it, or the
/// text line of what serves.
fn print_after(target: &Target, model: &str, answer: Value, as_json: bool) {
    let status = after(target, model);
    if as_json {
        let mut answer = answer;
        if let (Some(fields), Some(status)) = (answer.as_object_mut(), &status) {
            fields.entry("decision").or_insert_with(|| status["decision"].clone());
        }
        println!("{answer}");
    } else if let Some(status) = status {
        println!("{}", serving_line(model, &status));
    }
}

/// `baton load NAME [--version V] [--force] [--json]`: follows the stages
/// as they happen (not with --json).
pub fn load(target: &Target, model: &str, version: Option<u64>, force: bool, as_json: bool) -> anyhow::Result<()> {
    // The events come from the admin listener too, which serves them.
    let client = target.admin()?;
    let mut body = serde_json::Map::new();
    if let Some(v) = version {
        body.insert("version".into(), json!(v));
    }
    // Without --force, a load naming no version loads only what is new.
    if version.is_none() && !force {
        body.insert("if_new".into(), json!(true));
    }
    let body = Value::Object(body);
    if as_json {
        let answer = client.post_json(&format!("/baton/v1/models/{model}/load"), &body)?;
        print_after(target, model, answer, true);
        return Ok(());
    }
    // Subscribed before the load starts, so no stage is missed.
    let events = client.events()?;
    let watched = model.to_owned();
    let follower = std::thread::spawn(move || {
        let mut printed = 0;
        for line in events.lines() {
            let Ok(line) = line else { return };
            let Some(data) = line.strip_prefix("data:") else { continue };
            let Ok(event) = serde_json::from_str::<Value>(data.trim()) else { continue };
            if event["model"] == watched.as_str() {
                for text in render::progress(&event, &mut printed) {
                    println!("  {text}");
                }
                let _ = std::io::stdout().flush();
            }
            if event["model"] == watched.as_str() && matches!(event["event"].as_str(), Some("finished" | "failed")) {
                return;
            }
        }
    });
    println!("Loading {model}{}…", version.map(|v| format!(" version {v}")).unwrap_or_default());
    let result = client.post_json(&format!("/baton/v1/models/{model}/load"), &body);
    // The follower ends with the load's last event. A load refused before
    // it started (no token, unknown model, another operation running) has
    // none, nor one that found the version already serving, so it is only
    // waited for when the load ran: it succeeded, or a stage refused the
    // version (422) and the event saying so is coming.
    let ran = match &result {
        Ok(answer) => answer["already_serving"] != true,
        Err(error) => error.downcast_ref::<client::Refused>().is_some_and(|r| r.status == 422),
    };
    if ran {
        let _ = follower.join();
    }
    let report = result?;
    if report["already_serving"] == true {
        println!("{}", report["message"].as_str().unwrap_or("the version already serves"));
    } else {
        println!("{}", render::report(&report));
    }
    print_after(target, model, Value::Null, false);
    Ok(())
}

/// `baton rollback NAME`.
pub fn rollback(target: &Target, model: &str, as_json: bool) -> anyhow::Result<()> {
    let report = target.admin()?.post_json(&format!("/baton/v1/models/{model}/rollback"), &json!({}))?;
    if !as_json {
        println!("{}", render::report(&report));
    }
    print_after(target, model, report, as_json);
    Ok(())
}

/// `baton pin NAME VERSION`.
pub fn pin(target: &Target, model: &str, version: u64, as_json: bool) -> anyhow::Result<()> {
    let path = format!("/baton/v1/models/{model}/pin");
    let answer = target.admin()?.send_json(ureq::http::Method::PUT, &path, &json!({ "version": version }))?;
    match as_json {
        true => println!("{answer}"),
        false => println!("{}", render::decision(&answer)),
    }
    Ok(())
}

/// `baton unpin NAME`: warns when the model goes back to a newer version
/// than the pinned one (after a rollback, the one rolled back from).
pub fn unpin(target: &Target, model: &str, as_json: bool) -> anyhow::Result<()> {
    let path = format!("/baton/v1/models/{model}/pin");
    let answer = target.admin()?.send_json(ureq::http::Method::DELETE, &path, &json!({}))?;
    if as_json {
        println!("{answer}");
        return Ok(());
    }
    println!("{}", render::decision(&answer));
    let report = &answer["report"];
    if let (Some(now), Some(was)) = (report["version"].as_u64(), report["replaced"].as_u64())
        && now != was
    {
        println!(
            "WARNING: {model} went back to its newest version, {now}, in place of {was}: a pin replaces the hold a \
             rollback or a load of an older version recorded, and unpinning returns the model to the newest \
             version (the one rolled back from, after a rollback). To keep {was}: baton pin {model} {was}."
        );
    }
    Ok(())
}

/// `baton unload NAME`: the model leaves service, and stays out (across
/// restarts) until a version newer than its newest is published, or it
/// is loaded.
pub fn unload(target: &Target, model: &str, as_json: bool) -> anyhow::Result<()> {
    let answer = target.admin()?.post_json(&format!("/v2/repository/models/{model}/unload"), &json!({}))?;
    if as_json {
        print_after(target, model, answer, true);
        return Ok(());
    }
    match answer.get("operation") {
        Some(_) => println!(
            "unload {model}: version {} left service, {} in all",
            render::version(&answer["replaced"]),
            render::ms(&answer["total"])
        ),
        None => println!("{model} was not loaded: nothing to unload."),
    }
    print_after(target, model, Value::Null, false);
    Ok(())
}

/// `baton retire NAME VERSION`: frees a version kept for rollback.
pub fn retire(target: &Target, model: &str, version: u64, as_json: bool) -> anyhow::Result<()> {
    let path = format!("/baton/v1/models/{model}/versions/{version}/retire");
    let answer = target.admin()?.post_json(&path, &json!({}))?;
    if as_json {
        println!("{answer}");
        return Ok(());
    }
    println!("retire {model}: version {version} freed, {} in all", render::ms(&answer["total"]));
    print_after(target, model, Value::Null, false);
    Ok(())
}
